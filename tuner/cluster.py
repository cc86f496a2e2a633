"""Plan a deployment across N GPUs: aggregated replicas against prefill/decode-disaggregated workers (issue 39).

A layout is priced from the same per-forward costs the simulator uses (`tuner/perf.py`, re-priced from AIConfigurator's
kernel tables by `tuner/aic.py` where they cover the model), in steady state and without speculation:
- aggregated: a replica at TP t runs B requests; every iteration is a decode step over B rows plus, on average, the
  B / OSL prefills that keep the batch full (chunked prefill mixes them in), so TPOT = step(B) + (B / OSL) x
  prefill(ISL) and TTFT = prefill(ISL) + one iteration; replicas = N / t;
- disaggregated: a prefill worker at TP tp batches b prompts (TTFT = its forward + the KV's transfer to a decode worker
  over the GPU's network link); a decode worker at TP td runs B requests at TPOT = step(B); x prefill and y decode
  workers on at most N GPUs serve min(x x prefill rate, y x decode rate) requests a second.
Each mode's candidates meeting the TTFT / TPOT SLOs form a Pareto front of tokens/s per GPU against tokens/s per user;
`plan` returns both fronts and each mode's best point.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tuner.errors import TunerError

BATCHES = (*range(1, 16), *range(16, 64, 2), *range(64, 513, 8))  # requests tried per worker (per attention-DP rank)
MEMORY_FRACTION = 0.88  # of GPU memory for weights + KV (SGLang's --mem-fraction-static default range)
NETWORK_GBS = 50.0  # per GPU between nodes: one 400 Gb/s ConnectX-7 per GPU in NVIDIA DGX H100 / H200 / B200


@dataclass(frozen=True)
class Assumptions:
    """What a plan assumes beyond the priced forwards: how disaggregated workers lose against their isolated rates,
    which worker shapes pair, and what TTFT pays. `OURS` is what the planner assumes;
    `AIC_SGLANG` is what AIConfigurator 0.12.0 assumes for SGLang (its `aiconfigurator/sdk` files, cited in
    benchmarks/bench_vs_aic_cluster.py), so the comparison can tell pricing apart from assumptions. The defaults
    assume nothing: no loss, any worker shapes."""

    prefill_scale: float = 1.0  # a prefill forward's latency x this
    decode_scale: float = 1.0  # a disaggregated decode step x this
    prefill_share: float = 1.0  # of a prefill pool's isolated rate that rate matching gets
    decode_share: float = 1.0  # of a decode pool's
    ttft_scale: float = 1.0  # TTFT = this x the prefill (queueing under load)
    same_tp: bool = False  # prefill and decode workers of one attention TP only
    same_worker: bool = False  # prefill and decode workers of one shape only (GPUs, attention DP, EP)
    prefill_batches: tuple[int, ...] = (1, 2, 4, 8)  # prompts a prefill worker batches into one forward
    kv_transfer: bool = True  # charge the KV's crossing to the decode worker
    replica_sizes: tuple[int, ...] = ()  # GPUs one xPyD group may take, the cluster holding whole groups (): any


# the planner's own: AIC's empirical losses of disaggregated serving (its only measured figures for it: prefill and
# decode latency corrections, rate-matching degradations, TTFT's queueing factor; aiconfigurator 0.12.0
# sdk/task_v2.py:643-644, sdk/sweep.py:65-75), with the physics AIC leaves out (the KV transfer) and the layouts SGLang
# runs that AIC does not search (prefill / decode of different TP over mooncake, SGLang PRs 5922 and 6793; batched
# prefills; any x, y filling the cluster)
OURS = Assumptions(prefill_scale=1.1, decode_scale=1.08, prefill_share=0.9, decode_share=0.92, ttft_scale=1.8)
def assumptions_for(profile: Any) -> Assumptions:
    """The planner's assumptions for `profile`'s model: a MoE model's tuned server may run its experts in parallel
    and its attention data-parallel, a layout its prefill workers share, so prefill and decode pair at one TP (as
    AIC pairs them on SGLang)."""
    return replace(OURS, same_tp=True, same_worker=True) if profile.model.num_experts else OURS


AIC_SGLANG = Assumptions(prefill_scale=1.1, decode_scale=1.08, prefill_share=0.9, decode_share=0.92, ttft_scale=1.8,
                         same_tp=True, prefill_batches=(1,), kv_transfer=False,
                         replica_sizes=(1, 2, 4, 8, *range(16, 129, 8)))


@dataclass(frozen=True)
class Slo:
    """What every served request must meet."""

    ttft_ms: float  # time to first token
    tpot_ms: float  # time per output token


@dataclass(frozen=True)
class Layout:
    """One deployment of the model on the cluster and its steady-state figures."""

    mode: str  # agg | disagg
    gpus: int  # GPUs the layout uses (<= the cluster's)
    tokens_per_s_gpu: float  # output tokens/s over the cluster's GPUs (idle ones counted, as AIC ranks layouts)
    tokens_per_s_user: float  # output tokens/s one request sees (1 / TPOT)
    ttft_ms: float
    tpot_ms: float
    tp: int = 0  # agg: GPUs of a replica (SGLang's --tp-size)
    replicas: int = 0  # agg: replicas behind the router
    batch: int = 0  # agg: requests per replica
    prefill_tp: int = 0  # disagg: TP of a prefill worker
    prefill_workers: int = 0
    prefill_batch: int = 0  # disagg: prompts per prefill forward
    decode_tp: int = 0  # disagg: TP of a decode worker
    decode_workers: int = 0
    decode_batch: int = 0  # disagg: requests per decode worker
    prefill_rate: float = 0.0  # disagg: requests/s one prefill worker completes
    decode_rate: float = 0.0  # disagg: requests/s one decode worker completes
    attn_dp: int = 1  # the replica's (agg) or decode worker's attention-DP ranks (1: TP attention)
    ep: int = 1  # its MoE's expert-parallel ranks (1: experts TP over its GPUs)
    prefill_attn_dp: int = 1  # disagg: a prefill worker's
    prefill_ep: int = 1

    def describe(self) -> str:
        """One line: the layout and its figures."""
        if self.mode == "agg":
            shape = f"{self.replicas} x {worker_name(self.tp, self.attn_dp, self.ep)}, {self.batch} requests each"
        else:
            shape = (f"{self.prefill_workers}P x {worker_name(self.prefill_tp, self.prefill_attn_dp, self.prefill_ep)}"
                     f" (batch {self.prefill_batch}) + {self.decode_workers}D x "
                     f"{worker_name(self.decode_tp, self.attn_dp, self.ep)} ({self.decode_batch} requests each)")
        return (f"{self.mode}: {shape} on {self.gpus} GPUs: {self.tokens_per_s_gpu:.1f} tok/s/GPU, "
                f"{self.tokens_per_s_user:.1f} tok/s/user, TTFT {self.ttft_ms:.0f} ms, TPOT {self.tpot_ms:.1f} ms")


@dataclass
class ClusterPlan:
    """Both serving modes' Pareto fronts at the SLO and the best point of each."""

    gpus: int
    slo: Slo
    fronts: dict[str, list[Layout]] = field(default_factory=dict)  # mode -> front, best tok/s/GPU first
    cost_source: str = ""  # what priced the forwards
    dtype: str = "bf16"  # weights (and KV cache) the forwards were priced in

    def best(self, mode: str | None = None) -> Layout | None:
        """The layout with the most tokens/s per GPU (of `mode`, or of either)."""
        pts = [p for m, f in self.fronts.items() if mode in (None, m) for p in f]
        return max(pts, key=lambda p: p.tokens_per_s_gpu, default=None)


def worker_name(tp: int, attn_dp: int = 1, ep: int = 1) -> str:
    """A worker's shape in words: "TP4", or "TP4 (attention DP 4, EP 2)"."""
    extra = [f"attention DP {attn_dp}"] * (attn_dp > 1) + [f"EP {ep}"] * (ep > 1)
    return f"TP{tp}" + (f" ({', '.join(extra)})" if extra else "")


def pareto(points: list[Layout]) -> list[Layout]:
    """The points no other beats on both tokens/s per GPU and per user, best per GPU first."""
    front: list[Layout] = []
    for p in sorted(points, key=lambda p: (-p.tokens_per_s_gpu, -p.tokens_per_s_user)):
        if not front or p.tokens_per_s_user > front[-1].tokens_per_s_user:
            front.append(p)
    return front


def tps(gpus: int, per_node: int = 8) -> list[int]:
    """TP sizes a worker may take: powers of two within the cluster that divide a node (a worker never spans
    nodes, and workers of these sizes pack the nodes without a gap)."""
    return [t for t in (1, 2, 4, 8, 16) if t <= min(gpus, per_node) and per_node % t == 0]


def moe_shapes(tp: int, experts: int) -> list[tuple[int, int]]:
    """(attention DP, EP) a MoE worker of `tp` GPUs may run, as the bundles launch them (tuner/objective.py
    moe_layout): attention TP over all its GPUs or one attention replica per GPU, and any power-of-two EP dividing
    both its GPUs and the experts. A dense model's worker: TP only."""
    if not experts or tp <= 1:
        return [(1, 1)]
    eps = [e for e in (1, 2, 4, 8, 16) if e <= tp and tp % e == 0 and experts % e == 0]
    return [(dp, ep) for dp in (1, tp) for ep in eps]


def replicas_of(gpus: int, tp: int, per_node: int) -> int:
    """Replicas of TP `tp` that whole nodes of `per_node` GPUs (and the rest of one) hold."""
    return (gpus // per_node) * (per_node // tp) + (gpus % per_node) // tp


class _Costs:
    """Forward times of one (model, GPU, dtype) at each TP, memoised (seconds), priced as the simulator prices them
    (SimulateEvaluator.perf)."""

    def __init__(self, profile: Any, dtype: str, kv_dtype: str, engine: str, cost: str) -> None:
        from tuner.estimate import resolved_cost
        from tuner.objective import SimulateEvaluator

        self.ev = SimulateEvaluator(profile, cost=resolved_cost(cost, profile, engine), engine=engine)
        self.dtype, self.kv_dtype = dtype, kv_dtype
        self._perf: dict[tuple[int, int, int], Any] = {}
        self._memo: dict[tuple, float] = {}
        self.source = ""
        self.experts = int(profile.model.num_experts or 0)

    def perf(self, tp: int, dp: int = 1, ep: int = 1) -> Any:
        """The priced server of `tp` GPUs, `dp` attention-DP ranks (1 or tp) and `ep` EP ranks."""
        key = (tp, dp, ep)
        if key not in self._perf:
            self._perf[key] = self.ev.perf({"weights.dtype": self.dtype, "kv.dtype": self.kv_dtype, "parallel.tp": tp,
                                            "parallel.dp_attention": dp > 1, "parallel.ep": ep})
            self.source = self.source or self._perf[key].cost_source
        return self._perf[key]

    def shapes(self, tp: int) -> list[tuple[int, int]]:
        """The (attention DP, EP) layouts of a `tp`-GPU worker this plan searches, each priced by the plan's cost
        source: with AIC's tables, every layout they price (a MoE model's attention DP and EP among them; a layout
        AIC refuses, such as block-quantised FP8 experts split below the block at MoE TP 4, is not planned rather
        than priced by the roofline beside AIC-priced ones); with the roofline, TP only (it prices every layout as
        TP, so it cannot rank them)."""
        if self.ev.cost != "aic":
            return [(1, 1)]
        out = []
        for dp, ep in moe_shapes(tp, self.experts):
            got = self.perf(tp, dp, ep)
            if got.cost_source.startswith("aic") and (got.attn_dp, got.ep) == (dp, ep):
                out.append((dp, ep))
        return out

    def decode(self, w: tuple[int, int, int], batch: int, context: float) -> float:
        """One decode step of worker `w` (GPUs, attention DP, EP) running `batch` requests in all."""
        key = ("d", w, batch, round(context))
        if key not in self._memo:
            self._memo[key] = self.perf(*w).step(batch, context, batch).seconds
        return self._memo[key]

    def prefill(self, w: tuple[int, int, int], prompts: int, isl: int) -> float:
        """One prefill forward of worker `w` over `prompts` prompts per attention-DP rank (every rank at once)."""
        key = ("p", w, prompts, isl)
        if key not in self._memo:
            n = prompts * w[1]
            self._memo[key] = self.perf(*w).prefill(n * isl, isl, n).seconds
        return self._memo[key]

    def fits(self, w: tuple[int, int, int], requests: int, tokens: int) -> bool:
        """Whether `requests` requests of `tokens` tokens each fit worker `w`'s KV cache beside its weights."""
        return self.perf(*w).kv_capacity_tokens(MEMORY_FRACTION) >= requests * tokens


def _agg(c: _Costs, gpus: int, isl: int, osl: int, slo: Slo, per_node: int) -> list[Layout]:
    out = []
    ctx = isl + osl / 2
    for t in tps(gpus, per_node):
        replicas = replicas_of(gpus, t, per_node)
        for dp, ep in c.shapes(t):
            w = (t, dp, ep)
            pre = c.prefill(w, 1, isl)  # one prompt on every attention-DP rank
            for b in BATCHES:  # requests per attention-DP rank
                n = b * dp
                if not c.fits(w, n, isl + osl):
                    break
                tpot = c.decode(w, n, ctx) + b / osl * pre
                ttft = pre + tpot
                if tpot * 1e3 > slo.tpot_ms or ttft * 1e3 > slo.ttft_ms:
                    continue
                out.append(Layout("agg", replicas * t, replicas * n / tpot / gpus, 1 / tpot, ttft * 1e3, tpot * 1e3,
                                  tp=t, replicas=replicas, batch=n, attn_dp=dp, ep=ep))
    return out


def _disagg(c: _Costs, gpus: int, isl: int, osl: int, slo: Slo, per_node: int, link_bytes_s: float,
            how: Assumptions = OURS) -> list[Layout]:
    ctx = isl + osl / 2
    moved = how.kv_transfer and link_bytes_s > 0
    kv_s = isl * c.perf(1).kv_bytes_per_token() / link_bytes_s if moved else 0.0
    workers = [(t, dp, ep) for t in tps(gpus, per_node) for dp, ep in c.shapes(t)]
    prefills = []  # (worker, prompts per forward, requests/s per worker, ttft s)
    for w in workers:
        for b in how.prefill_batches:  # prompts per attention-DP rank
            if not c.fits(w, b * w[1], isl):
                break
            took = c.prefill(w, b, isl) * how.prefill_scale
            ttft = took * how.ttft_scale + kv_s
            if ttft * 1e3 <= slo.ttft_ms:
                prefills.append((w, b * w[1], b * w[1] / took, ttft))
    decodes = []  # (worker, requests, requests/s per worker, tpot s)
    for w in workers:
        for b in BATCHES:  # requests per attention-DP rank
            if not c.fits(w, b * w[1], isl + osl):
                break
            tpot = c.decode(w, b * w[1], ctx) * how.decode_scale
            if tpot * 1e3 <= slo.tpot_ms:
                decodes.append((w, b * w[1], b * w[1] / tpot / osl, tpot))
    out = []
    for pw, pb, prate, ttft in prefills:
        for dw, db, drate, tpot in decodes:
            if (how.same_worker and pw != dw) or (how.same_tp and pw[0] // pw[1] != dw[0] // dw[1]):
                continue
            best = _split(gpus, osl, Layout("disagg", 0, 0.0, 1 / tpot, ttft * 1e3, tpot * 1e3, prefill_tp=pw[0],
                                             prefill_batch=pb, decode_tp=dw[0], decode_batch=db,
                                             prefill_rate=prate * how.prefill_share,
                                             decode_rate=drate * how.decode_share, attn_dp=dw[1], ep=dw[2],
                                             prefill_attn_dp=pw[1], prefill_ep=pw[2]), how.replica_sizes)
            if best is not None:
                out.append(best)
    return out


def _split(gpus: int, osl: int, lay: Layout, replica_sizes: tuple[int, ...] = ()) -> Layout | None:
    """`lay` (a disaggregated pair of worker shapes) with the prefill / decode worker counts that serve the most
    requests on `gpus`: x prefill and y decode workers serve min(x x prefill rate, y x decode rate) a second. With
    `replica_sizes`, the x + y workers form a group of exactly one of those GPU counts and the cluster holds as many
    whole groups as fit (the rest idle)."""
    best: Layout | None = None
    for x in range(1, gpus // lay.prefill_tp):
        rest = (gpus - x * lay.prefill_tp) // lay.decode_tp
        if rest < 1:
            break
        ys = range(1, rest + 1) if replica_sizes else range(rest, rest + 1)  # filling the cluster: the most D
        for y in ys:
            size = x * lay.prefill_tp + y * lay.decode_tp
            if replica_sizes and size not in replica_sizes:
                continue
            groups = gpus // size if replica_sizes else 1
            rate = min(x * lay.prefill_rate, y * lay.decode_rate) * groups
            got = replace(lay, gpus=size * groups, tokens_per_s_gpu=rate * osl / gpus, prefill_workers=x * groups,
                          decode_workers=y * groups)
            if best is None or got.tokens_per_s_gpu > best.tokens_per_s_gpu:
                best = got
    return best


def with_worker(lay: Layout, worker_tokens_s: float, tpot_ms: float, cluster_gpus: int, osl: int,
                how: Assumptions = OURS) -> Layout:
    """`lay` with its decoding server as tuned: one replica (agg) or decode worker (disagg) emitting
    `worker_tokens_s` output tokens a second at a mean TPOT of `tpot_ms` when alone (the simulator's figures).
    Aggregated, the replicas serve that each; disaggregated, the decode workers complete that / OSL requests a
    second, with the plan's disaggregation losses (`how`), so the prefill / decode split is searched again."""
    if lay.mode == "agg":
        return replace(lay, tokens_per_s_gpu=worker_tokens_s * lay.replicas / cluster_gpus,
                       tokens_per_s_user=1e3 / tpot_ms, tpot_ms=tpot_ms)
    tpot = tpot_ms * how.decode_scale
    rate = worker_tokens_s / osl / how.decode_scale * how.decode_share
    got = _split(cluster_gpus, osl, replace(lay, decode_rate=rate, tpot_ms=tpot, tokens_per_s_user=1e3 / tpot),
                 how.replica_sizes)
    assert got is not None  # the same worker shapes fit as before
    return got


def plan(profile: Any, gpus: int, isl: int, osl: int, slo: Slo, serving: str = "auto", *, dtype: str = "bf16",
         kv_dtype: str = "bf16", engine: str = "sglang", cost: str = "auto", per_node: int = 8,
         link_gbs: float | None = None, how: Assumptions = OURS) -> ClusterPlan:
    """The Pareto fronts of `serving` (agg, disagg or auto: both) for `profile`'s model on `gpus` of its GPU at
    ISL / OSL and `slo`. `link_gbs`: GB/s a prefill worker's KV crosses to a decode worker (default: the GPU
    catalogue's network link per GPU)."""
    if serving not in ("agg", "disagg", "auto"):
        raise TunerError(f"--serving {serving!r}: choose agg, disagg or auto")
    if gpus < 1 or isl < 1 or osl < 1:
        raise TunerError(f"--gpus, --isl and --osl must be positive (got {gpus}, {isl}, {osl})")
    c = _Costs(profile, dtype, kv_dtype, engine, cost)
    out = ClusterPlan(gpus, slo)
    if serving in ("agg", "auto"):
        out.fronts["agg"] = pareto(_agg(c, gpus, isl, osl, slo, per_node))
    if serving in ("disagg", "auto") and gpus >= 2:
        link = link_gbs if link_gbs is not None else NETWORK_GBS
        out.fronts["disagg"] = pareto(_disagg(c, gpus, isl, osl, slo, per_node, link * 1e9, how))
    out.cost_source, out.dtype = c.source, dtype
    return out
