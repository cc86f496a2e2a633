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

from dataclasses import dataclass, field
from typing import Any

from tuner.errors import TunerError

BATCHES = (1, 2, 4, *range(8, 513, 8))  # decode batch sizes tried per worker
PREFILL_BATCHES = (1, 2, 4, 8)  # prompts a prefill worker batches into one forward
MEMORY_FRACTION = 0.88  # of GPU memory for weights + KV (SGLang's --mem-fraction-static default range)
NETWORK_GBS = 50.0  # per GPU between nodes: one 400 Gb/s ConnectX-7 per GPU in NVIDIA DGX H100 / H200 / B200


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
    tp: int = 0  # agg: TP of a replica
    replicas: int = 0  # agg: replicas behind the router
    batch: int = 0  # agg: requests per replica
    prefill_tp: int = 0  # disagg: TP of a prefill worker
    prefill_workers: int = 0
    prefill_batch: int = 0  # disagg: prompts per prefill forward
    decode_tp: int = 0  # disagg: TP of a decode worker
    decode_workers: int = 0
    decode_batch: int = 0  # disagg: requests per decode worker

    def describe(self) -> str:
        """One line: the layout and its figures."""
        if self.mode == "agg":
            shape = f"{self.replicas} x TP{self.tp}, {self.batch} requests each"
        else:
            shape = (f"{self.prefill_workers}P x TP{self.prefill_tp} (batch {self.prefill_batch}) + "
                     f"{self.decode_workers}D x TP{self.decode_tp} ({self.decode_batch} requests each)")
        return (f"{self.mode}: {shape} on {self.gpus} GPUs: {self.tokens_per_s_gpu:.1f} tok/s/GPU, "
                f"{self.tokens_per_s_user:.1f} tok/s/user, TTFT {self.ttft_ms:.0f} ms, TPOT {self.tpot_ms:.1f} ms")


@dataclass
class ClusterPlan:
    """Both serving modes' Pareto fronts at the SLO and the best point of each."""

    gpus: int
    slo: Slo
    fronts: dict[str, list[Layout]] = field(default_factory=dict)  # mode -> front, best tok/s/GPU first
    cost_source: str = ""  # what priced the forwards

    def best(self, mode: str | None = None) -> Layout | None:
        """The layout with the most tokens/s per GPU (of `mode`, or of either)."""
        pts = [p for m, f in self.fronts.items() if mode in (None, m) for p in f]
        return max(pts, key=lambda p: p.tokens_per_s_gpu, default=None)


def pareto(points: list[Layout]) -> list[Layout]:
    """The points no other beats on both tokens/s per GPU and per user, best per GPU first."""
    front: list[Layout] = []
    for p in sorted(points, key=lambda p: (-p.tokens_per_s_gpu, -p.tokens_per_s_user)):
        if not front or p.tokens_per_s_user > front[-1].tokens_per_s_user:
            front.append(p)
    return front


def tps(gpus: int, per_node: int = 8) -> list[int]:
    """TP sizes a worker may take: powers of two within one node and the cluster."""
    return [t for t in (1, 2, 4, 8, 16) if t <= min(gpus, per_node)]


class _Costs:
    """Forward times of one (model, GPU, dtype) at each TP, memoised (seconds), priced as the simulator prices them
    (SimulateEvaluator.perf)."""

    def __init__(self, profile: Any, dtype: str, kv_dtype: str, engine: str, cost: str) -> None:
        from tuner.estimate import resolved_cost
        from tuner.objective import SimulateEvaluator

        self.ev = SimulateEvaluator(profile, cost=resolved_cost(cost, profile, engine), engine=engine)
        self.dtype, self.kv_dtype = dtype, kv_dtype
        self._perf: dict[int, Any] = {}
        self._memo: dict[tuple, float] = {}
        self.source = ""

    def perf(self, tp: int) -> Any:
        if tp not in self._perf:
            self._perf[tp] = self.ev.perf({"weights.dtype": self.dtype, "kv.dtype": self.kv_dtype, "parallel.tp": tp})
            self.source = self.source or self._perf[tp].cost_source
        return self._perf[tp]

    def decode(self, tp: int, batch: int, context: float) -> float:
        key = ("d", tp, batch, round(context))
        if key not in self._memo:
            self._memo[key] = self.perf(tp).step(batch, context, batch).seconds
        return self._memo[key]

    def prefill(self, tp: int, prompts: int, isl: int) -> float:
        key = ("p", tp, prompts, isl)
        if key not in self._memo:
            self._memo[key] = self.perf(tp).prefill(prompts * isl, isl, prompts).seconds
        return self._memo[key]

    def fits(self, tp: int, requests: int, tokens: int) -> bool:
        """Whether `requests` requests of `tokens` tokens each fit the KV cache beside the weights at TP tp."""
        return self.perf(tp).kv_capacity_tokens(MEMORY_FRACTION) >= requests * tokens


def _agg(c: _Costs, gpus: int, isl: int, osl: int, slo: Slo, per_node: int) -> list[Layout]:
    out = []
    ctx = isl + osl / 2
    for t in tps(gpus, per_node):
        replicas = gpus // t
        pre = c.prefill(t, 1, isl)
        for b in BATCHES:
            if not c.fits(t, b, isl + osl):
                break
            tpot = c.decode(t, b, ctx) + b / osl * pre
            ttft = pre + tpot
            if tpot * 1e3 > slo.tpot_ms or ttft * 1e3 > slo.ttft_ms:
                continue
            out.append(Layout("agg", replicas * t, replicas * b / tpot / gpus, 1 / tpot, ttft * 1e3, tpot * 1e3, tp=t,
                              replicas=replicas, batch=b))
    return out


def _disagg(c: _Costs, gpus: int, isl: int, osl: int, slo: Slo, per_node: int, link_bytes_s: float) -> list[Layout]:
    ctx = isl + osl / 2
    kv_s = isl * c.perf(1).kv_bytes_per_token() / link_bytes_s if link_bytes_s > 0 else 0.0
    prefills = []  # (tp, batch, requests/s per worker, ttft s)
    for t in tps(gpus, per_node):
        for b in PREFILL_BATCHES:
            if not c.fits(t, b, isl):
                break
            took = c.prefill(t, b, isl)
            ttft = took + kv_s
            if ttft * 1e3 <= slo.ttft_ms:
                prefills.append((t, b, b / took, ttft))
    decodes = []  # (tp, batch, requests/s per worker, tpot s)
    for t in tps(gpus, per_node):
        for b in BATCHES:
            if not c.fits(t, b, isl + osl):
                break
            tpot = c.decode(t, b, ctx)
            if tpot * 1e3 <= slo.tpot_ms:
                decodes.append((t, b, b / tpot / osl, tpot))
    out = []
    for pt, pb, prate, ttft in prefills:
        for dt, db, drate, tpot in decodes:
            best: Layout | None = None
            for x in range(1, gpus // pt):
                y = (gpus - x * pt) // dt
                if y < 1:
                    break
                used = x * pt + y * dt
                rate = min(x * prate, y * drate)
                lay = Layout("disagg", used, rate * osl / gpus, 1 / tpot, ttft * 1e3, tpot * 1e3, prefill_tp=pt,
                             prefill_workers=x, prefill_batch=pb, decode_tp=dt, decode_workers=y, decode_batch=db)
                if best is None or lay.tokens_per_s_gpu > best.tokens_per_s_gpu:
                    best = lay
            if best is not None:
                out.append(best)
    return out


def plan(profile: Any, gpus: int, isl: int, osl: int, slo: Slo, serving: str = "auto", *, dtype: str = "bf16",
         kv_dtype: str = "bf16", engine: str = "sglang", cost: str = "auto", per_node: int = 8,
         link_gbs: float | None = None) -> ClusterPlan:
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
        out.fronts["disagg"] = pareto(_disagg(c, gpus, isl, osl, slo, per_node, link * 1e9))
    out.cost_source = c.source
    return out
