"""`tune --serving agg|disagg|auto --gpus N [--nodes M]`: the whole deployment across N GPUs (issue 39).

1. `plan_cluster`: tuner/cluster.py's Pareto fronts of aggregated replicas and of disaggregated prefill / decode
   workers at the profile's mean prompt and output lengths and SLOs, speculation off (as AIConfigurator plans),
   and the layout with the most tokens/s per GPU.
2. `ClusterChoice.worker_traffic` / `pin`: the server the usual study then tunes, speculation included: a replica
   (agg) or a decode worker (disagg), at its TP and its requests in flight. A decode worker's prompts were prefilled
   elsewhere: its TTFT SLO is what the prefill and the KV transfer leave of the user's.
3. `write_cluster` (called inside the bundle's staging, tuner/export.py): the layout again with its decoding server
   as tuned (`cluster.with_worker`: the exported trial's simulated throughput and mean TPOT; a disaggregated
   prefill / decode split is searched again), cluster.json, the Pareto plot, a report section, and the
   deployment's launch scripts (tuner/cluster_scripts.py), each a thin wrapper over the tuned server's own
   sglang.sh / vllm.sh, so every worker runs exactly the tuned flags.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.cluster import ClusterPlan, Layout, Slo, assumptions_for, plan, with_worker, worker_name
from tuner.errors import TunerError

GPUS_PER_NODE = 8  # a node when --nodes is not given (HGX / DGX boards)
TAIL_ROUNDS = 4  # plans at most: each one's decoding server is simulated, and a p99 TPOT over the SLO tightens the next


@dataclass
class ClusterChoice:
    """The planned deployment and the worker whose server is tuned."""

    plan: ClusterPlan
    chosen: Layout  # speculation off
    gpus: int
    nodes: int
    per_node: int  # GPUs per node
    isl: int
    osl: int
    serving: str  # what was asked: agg | disagg | auto

    @property
    def worker_tp(self) -> int:
        return self.chosen.tp if self.chosen.mode == "agg" else self.chosen.decode_tp

    @property
    def worker_name(self) -> str:
        """The tuned server's shape in words ("TP4", "TP4 (attention DP 4, EP 2)")."""
        return worker_name(self.worker_tp, self.chosen.attn_dp, self.chosen.ep)

    @property
    def worker_batch(self) -> int:
        return self.chosen.batch if self.chosen.mode == "agg" else self.chosen.decode_batch

    def to_json(self) -> dict[str, Any]:
        """What the study stores (StudySpec.cluster), so `export` writes the same deployment again."""
        slo = [_finite(self.plan.slo.ttft_ms), _finite(self.plan.slo.tpot_ms)]
        return {"plan": {"gpus": self.plan.gpus, "slo": slo,
                         "fronts": _fronts(self.plan),
                         "cost_source": self.plan.cost_source, "dtype": self.plan.dtype},
                "chosen": asdict(self.chosen), "gpus": self.gpus, "nodes": self.nodes, "per_node": self.per_node,
                "isl": self.isl, "osl": self.osl, "serving": self.serving}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterChoice:
        p = d["plan"]
        slo = Slo(*(math.inf if v is None else v for v in p["slo"]))
        got = ClusterPlan(p["gpus"], slo, {m: [Layout(**x) for x in f] for m, f in p["fronts"].items()},
                          p["cost_source"], p.get("dtype", "bf16"))
        return cls(got, Layout(**d["chosen"]), d["gpus"], d["nodes"], d["per_node"], d["isl"], d["osl"], d["serving"])

    def pin(self, plan: Any) -> Any:
        """The rules' plan for the tuned server with its layout fixed to the planned one (TP; a MoE model's attention
        DP and EP): the layout is the cluster plan's choice, and a server of another shape (or of data-parallel
        replicas) would not be the planned worker."""
        from kb.match import FixedEntry

        role = "replica" if self.chosen.mode == "agg" else "decode worker"
        why = f"the planned {self.chosen.mode} layout's {role}: {self.worker_name}"
        pinned = {"parallel.tp": self.worker_tp}
        layout = ("parallel.dp_attention", "parallel.ep")  # a MoE model's, where the rules or the plan set them
        if self.chosen.attn_dp > 1 or self.chosen.ep > 1 or any(k in plan.space or k in plan.fixed for k in layout):
            pinned |= {"parallel.dp_attention": self.chosen.attn_dp > 1, "parallel.ep": self.chosen.ep}
        fixed = {**plan.fixed, **{k: FixedEntry(value=v, rules=["tune --serving"], why=why) for k, v in pinned.items()}}
        space = {k: v for k, v in plan.space.items() if k not in pinned}
        prefer = {k: v for k, v in plan.prefer.items() if k not in pinned}
        return plan.model_copy(update={"fixed": fixed, "space": space, "prefer": prefer})

    def worker_traffic(self) -> Any:  # -> profiler.workload.Traffic
        """The tuned server's load: its requests in flight; a decode worker's TTFT SLO is what the planned prefill
        and KV transfer leave of the user's (its own TTFT is the wait for a running slot)."""
        from profiler.workload import Traffic

        if self.chosen.mode == "agg" or math.isinf(self.plan.slo.ttft_ms):
            return Traffic(self.worker_batch, None, None)
        left = self.plan.slo.ttft_ms - self.chosen.ttft_ms  # what prefill and the KV transfer leave of the TTFT
        return Traffic(self.worker_batch, max(1.0, left), None)


def lengths(profile: Any) -> tuple[int, int]:
    """The workload's mean prompt and output lengths (else the p50s), one line when it states none: a running batch
    holds the mean request's KV (a p50 plan overcommits the cache by 40% on a long-tailed chat preset, and its
    requests then queue), and the simulator's context is the mean prompt."""
    wl = profile.workload

    def typical(ls: Any, what: str) -> int:
        v = (ls.mean or ls.p50) if ls is not None else None
        if not v:
            raise TunerError(f"--serving: the workload {wl.name or ''} states no {what} length; profile a preset or "
                             "a JSONL file of requests")
        return max(1, round(v))

    return typical(wl.prompt_len, "prompt"), typical(wl.output_len, "output")


def node_shape(gpus: int, nodes: int | None, serving: str = "auto") -> tuple[int, int]:
    """(nodes, GPUs per node) of a cluster of `gpus` on `nodes` nodes (default: nodes of eight); one line when they
    do not divide, or when `serving` disagg has no room for two workers."""
    if gpus < 1:
        raise TunerError(f"--gpus {gpus}: give the cluster's GPU count, at least 1")
    if serving == "disagg" and gpus < 2:
        raise TunerError(f"--serving disagg: {gpus} GPU cannot hold a prefill and a decode worker; give --gpus 2 or "
                         "more, or --serving agg")
    nodes = nodes if nodes is not None else math.ceil(gpus / GPUS_PER_NODE)
    if nodes < 1 or gpus % nodes:
        raise TunerError(f"--nodes {nodes}: {gpus} GPUs do not split evenly over {nodes} nodes; give a divisor")
    return nodes, gpus // nodes


def plan_cluster(profile: Any, gpus: int, nodes: int | None, serving: str, cost: str = "auto",
                 engine: str = "sglang") -> ClusterChoice:
    """Plan `serving` over `gpus` GPUs on `nodes` nodes (default: nodes of eight) for the profile's model, GPU,
    lengths and SLOs; one TunerError line when the sizes do not divide or no layout meets the SLOs."""
    nodes, per_node = node_shape(gpus, nodes, serving)
    isl, osl = lengths(profile)
    slo = profile.workload.slo
    limits = Slo(ttft_ms=(slo.ttft_ms if slo and slo.ttft_ms else math.inf),
                 tpot_ms=(slo.tpot_ms if slo and slo.tpot_ms else math.inf))
    tpot_limit = limits.tpot_ms
    for _ in range(TAIL_ROUNDS):
        got = _best_dtype(profile, gpus, isl, osl, Slo(limits.ttft_ms, tpot_limit), serving, engine, cost, per_node)
        got.slo = limits
        best = got.best()
        if best is None:
            _fits_one_node(profile, gpus, per_node, isl + osl, engine, cost)
            asked = " or ".join(got.fronts) or serving
            raise TunerError(f"--serving {serving}: no {asked} layout of {profile.model.name} on {gpus} x "
                             f"{profile.hw.name} meets p99 TTFT {_ms(limits.ttft_ms)} / TPOT {_ms(limits.tpot_ms)} "
                             f"at {isl} prompt / {osl} output tokens; loosen the SLOs or add GPUs")
        p99 = simulated_p99(profile, best, cost, got.dtype) if not math.isinf(limits.tpot_ms) else 0.0
        if p99 <= limits.tpot_ms * 1.001:
            break
        tpot_limit = min(tpot_limit, best.tpot_ms) * limits.tpot_ms / p99
    return ClusterChoice(got, best, gpus, nodes, per_node, isl, osl, serving)


def _fits_one_node(profile: Any, gpus: int, per_node: int, tokens: int, engine: str, cost: str) -> None:
    """One line when no worker can hold the model at all: its weights and one request's KV exceed the largest worker a
    node holds in every dtype the GPU runs (a worker does not span nodes), so no SLO or GPU count would help."""
    from tuner.cluster import _Costs, tps

    top = max(tps(gpus, per_node))
    dtypes = ["bf16", "fp8"] if profile.hw.fp8 else ["bf16"]
    if any(_Costs(profile, d, d, engine, cost).fits((top, 1, 1), 1, tokens) for d in dtypes):
        return
    mem = profile.hw.memory_gb
    raise TunerError(f"{profile.model.name}'s weights and one request's KV do not fit {top} x {profile.hw.name}"
                     f"{f' ({top * mem:.0f} GiB)' if mem else ''} in {' or '.join(dtypes)}, the largest worker "
                     f"{'a node of ' + str(per_node) if gpus > per_node else 'these GPUs'} can hold, and a worker "
                     "does not span nodes: plan on GPUs with more memory (e.g. --gpu h200) or a smaller model")


def _best_dtype(profile: Any, gpus: int, isl: int, osl: int, slo: Slo, serving: str, engine: str, cost: str,
                per_node: int) -> ClusterPlan:
    """The plan in the weight dtype whose best layout serves the most tokens/s per GPU: bf16, and FP8 (weights and KV
    cache) where the GPU runs it natively (a 671B model's bf16 weights do not fit 8 H200s; its checkpoint is FP8)."""
    dtypes = ["bf16", "fp8"] if profile.hw.fp8 else ["bf16"]
    how = assumptions_for(profile)
    plans = [plan(profile, gpus, isl, osl, slo, serving, dtype=d, kv_dtype=d, engine=engine, cost=cost,
                  per_node=per_node, how=how) for d in dtypes]
    return max(plans, key=lambda p: p.best().tokens_per_s_gpu if p.best() else -1.0)


def simulated_p99(profile: Any, lay: Layout, cost: str, dtype: str = "bf16") -> float:
    """The p99 TPOT (ms) of `lay`'s decoding server in the simulator: plain decoding in `dtype` at its batch, whole
    prompts a prefill, a decode worker's prompts arriving prefilled. The planner prices mean steps and the SLOs are
    p99s: requests that run through more prefills see a longer TPOT (Qwen3-8B, one H100, 312 requests: mean 49.5
    ms, as planned, p99 99 ms). 0.0 when the simulator cannot run it (the plan stands)."""
    from kb.match import Plan
    from tuner.estimate import resolved_cost
    from tuner.objective import SimulateEvaluator
    from tuner.space import space_from_plan

    tp, batch = (lay.tp, lay.batch) if lay.mode == "agg" else (lay.decode_tp, lay.decode_batch)
    wl = profile.workload.model_copy(update={"concurrency": batch, "request_rate": None})
    worker = profile.model_copy(update={"hw": profile.hw.model_copy(update={"count": tp}), "workload": wl})
    space = space_from_plan(Plan())  # the registry's defaults: the worker's settings below are the plan's
    first = {k: getattr(d, "choices", (getattr(d, "low", None),))[0] for k, d in space.distributions.items()}
    fp8 = dtype == "fp8"
    params = space.params_of({**first, **space.warm_start, "spec.enabled": False,
                              "weights.dtype": dtype if fp8 else "auto", "kv.dtype": "fp8_e4m3" if fp8 else "auto",
                              "parallel.tp": tp, "parallel.dp_attention": lay.attn_dp > 1, "parallel.ep": lay.ep,
                              "batch.max_requests": batch, "batch.chunked_prefill": 0,
                              "batch.max_tokens": 16384})
    ev = SimulateEvaluator(worker, cost=resolved_cost(cost, worker, "sglang"), decode_only=lay.mode == "disagg")
    got = ev.evaluate(params, seed=0)
    return got.metrics["tpot_p99_ms"] if got.feasible else 0.0


SERVING = ("agg", "disagg", "auto")


def check_serving(serving: str, engine: str | None, mode: str) -> None:
    """One line for a --serving that cannot run: an unknown mode, or with a measured / live study (the plan is the
    simulator's; a server measured here is one server, not a cluster)."""
    if serving not in SERVING:
        raise TunerError(f"--serving {serving!r}: choose agg, disagg or auto")
    if engine is not None or mode not in ("auto", "simulate"):
        raise TunerError("--serving plans a GPU cluster with the simulator: drop --engine / --mode measure")


def plan_deployment(database: Any, model: str | None, gpu: str | None, workload: str | None, traffic: Any,
                    drafter: str | None, gpus: int | None, nodes: int | None, serving: str, cost: str,
                    quiet: bool = False) -> tuple[ClusterChoice, tuple[int, Any]]:
    """`tune --serving`: profile the cluster, plan it, print the plan, then profile the server the study tunes (the
    replica or the decode worker, at its TP and load); (the plan, (the worker profile's id, the worker profile))."""
    from kb.cli_common import err_console
    from tuner.commands_tune import _gpu_ref, _model_ref, resolve_profile

    _, profile = resolve_profile(database, model, gpu, workload, traffic, drafter, gpus)
    if profile.hw.arch == "cpu":
        raise TunerError("--serving plans a GPU cluster: give --gpu (e.g. h100) and --gpus")
    n = gpus or profile.hw.count or GPUS_PER_NODE
    node_shape(n, nodes, serving)  # before any line is printed
    if not quiet:
        err_console.print(f"planning {n} x {profile.hw.name} for {profile.model.name}: aggregated replicas and "
                          "disaggregated prefill / decode workers, speculation off ...", highlight=False)
    choice = plan_cluster(profile, n, nodes, serving, cost)
    if not quiet:
        for front in choice.plan.fronts.values():
            if front:
                err_console.print(f"  best {front[0].describe()}", highlight=False, soft_wrap=True)
        err_console.print(f"chosen: {choice.chosen.mode}; tuning speculation on its "
                          f"{'replica' if choice.chosen.mode == 'agg' else 'decode worker'} ({choice.worker_name}, "
                          f"{choice.worker_batch} requests in flight)", highlight=False)
    worker = resolve_profile(database, _model_ref(profile), _gpu_ref(profile), None, choice.worker_traffic(),
                             drafter, choice.worker_tp)
    return choice, worker


def planned_point(space: Any, cluster: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
    """The tuned server's study point the cluster plan priced (`cluster`: StudySpec.cluster): plain decoding in the
    plan's dtype at the planned batch, the rest as `first` (the rules' preferred point). A study enqueues it so the
    search starts from the server the layout was chosen for."""
    choice = ClusterChoice.from_json(cluster)
    want: dict[str, Any] = {"batch.max_requests": choice.worker_batch}
    if choice.plan.dtype == "fp8":
        want |= {"weights.dtype": "fp8", "kv.dtype": "fp8_e4m3"}
    from tuner.design import inside

    out = dict(first)
    for k, v in want.items():
        if k in space.distributions:
            out[k] = inside(space.distributions[k], v, out[k])
    method = space.distributions.get("spec.method")
    if method is not None and "plain" in method.choices:
        out["spec.method"] = "plain"
    return out


def _ms(v: float) -> str:
    return "none" if math.isinf(v) else f"{v:g} ms"


def speedup_at_worker(evaluator: Any, params: dict[str, Any], seed: int) -> float:
    """The tuned speculation's predicted throughput over the same configuration without it, at the worker's load
    (tuner/gains.py's comparison rows); 1.0 when the tuned configuration does not speculate."""
    from tuner.gains import comparison

    if not params.get("spec.enabled", True):
        return 1.0
    rows = {r.label: r for r in comparison(evaluator, params, seed)}
    tuned, none = rows["tuned"].metrics.get("throughput"), rows["no speculation"].metrics.get("throughput")
    return tuned / none if tuned and none else 1.0


def placement(lay: Layout, nodes: int, per_node: int) -> list[dict[str, Any]]:
    """Each worker's node and GPU indices there: first fit, largest first (TP sizes divide the node, so this packs
    every layout the planner makes)."""
    if lay.mode == "agg":
        workers = [("replica", lay.tp)] * lay.replicas
    else:
        workers = [("prefill", lay.prefill_tp)] * lay.prefill_workers + [("decode", lay.decode_tp)] * lay.decode_workers
    free = [0] * nodes  # next free GPU index per node
    out, seen = [], {}
    for role, tp in sorted(workers, key=lambda w: -w[1]):
        node = next((n for n in range(nodes) if free[n] + tp <= per_node), None)
        if node is None:
            raise TunerError(f"internal: the planned {lay.mode} layout does not pack onto {nodes} x {per_node} GPUs")
        seen[role] = seen.get(role, -1) + 1
        out.append({"role": role, "index": seen[role], "node": node, "gpus": list(range(free[node], free[node] + tp))})
        free[node] += tp
    return out


def write_cluster(folder: Path, choice: ClusterChoice, evaluator: Any, params: dict[str, Any],
                  metrics: dict[str, float], seed: int, engines: tuple[str, ...], common: dict[str, Any],
                  schedules: dict[str, Any]) -> dict[str, Any]:
    """cluster.json, cluster.png, the deployment's launch scripts for `engines` and report.md's cluster section,
    into the bundle's staging `folder`; returns cluster.json's content. `metrics`: the exported trial's (per GPU of
    the tuned server); `schedules`: the exported draft-length schedules per engine."""
    from tuner.cluster_scripts import write_scripts
    from tuner.plots import cluster_fronts
    from tuner.targets import replicas

    speedup = speedup_at_worker(evaluator, params, seed)
    if metrics.get("throughput") and metrics.get("tpot_mean_ms"):
        tuned = with_worker(choice.chosen, metrics["throughput"] * choice.worker_tp, metrics["tpot_mean_ms"],
                            choice.gpus, choice.osl)
    else:  # the exported trial could not be simulated (report.md says why): the deployment as planned
        tuned = choice.chosen
    where = placement(tuned, choice.nodes, choice.per_node)
    data = {"gpus": choice.gpus, "nodes": choice.nodes, "gpus_per_node": choice.per_node, "serving": choice.serving,
            "isl": choice.isl, "osl": choice.osl, "cost_source": choice.plan.cost_source, "dtype": choice.plan.dtype,
            "slo": {"ttft_ms": _finite(choice.plan.slo.ttft_ms), "tpot_ms": _finite(choice.plan.slo.tpot_ms)},
            "planned": asdict(choice.chosen), "speculation_speedup": round(speedup, 4),
            "chosen": asdict(tuned), "placement": where,
            "fronts": _fronts(choice.plan)}
    (folder / "cluster.json").write_text(json.dumps(data, indent=2) + "\n")
    cluster_fronts(choice.plan.fronts, choice.chosen, tuned, folder / "cluster.png")
    vllm_dp = replicas(evaluator.profile, params) == 1 and not schedules.get("vllm")
    scripts = write_scripts(folder, tuned, choice, engines, vllm_dp, bool(params.get("spec.enabled", True)), common)
    _report(folder / "report.md", choice, tuned, speedup, bool(params.get("spec.enabled", True)), where, scripts)
    return data


def _fronts(got: ClusterPlan) -> dict[str, list[dict[str, Any]]]:
    return {m: [asdict(p) for p in f] for m, f in got.fronts.items()}


def _finite(v: float) -> float | None:
    return None if math.isinf(v) else v


def _report(path: Path, choice: ClusterChoice, tuned: Layout, speedup: float, spec_on: bool,
            where: list[dict[str, Any]], scripts: list[str]) -> None:
    """report.md's section on the deployment: both fronts, the chosen layout with and without the tuned
    speculation, where each worker runs, and which scripts start it."""
    slo = choice.plan.slo
    lines = ["", f"## The deployment across {choice.gpus} GPUs ({choice.nodes} node(s) of {choice.per_node})", "",
             f"`--serving {choice.serving}`, planned at {choice.isl} prompt / {choice.osl} output tokens (the "
             f"workload's means), p99 TTFT {_ms(slo.ttft_ms)}, TPOT {_ms(slo.tpot_ms)}, forwards priced by "
             f"{choice.plan.cost_source or 'the roofline'}, {choice.plan.dtype} weights and KV cache (the better of "
             "bf16 and FP8 where the GPU runs FP8), speculation off, as AIConfigurator plans; a layout whose decoding "
             "server's simulated p99 TPOT misses the SLO is planned again with less load. The "
             f"server tuned above is the {'replica' if tuned.mode == 'agg' else 'decode worker'} ("
             f"{choice.worker_name}, {choice.worker_batch} requests in flight"
             f"{'; its prompts arrive prefilled' if tuned.mode == 'disagg' else ''}); "
             + (f"its tuned speculation decodes **{speedup:.2f}x** the tokens of the same server without it"
                if spec_on else "the study turned speculation **off** there: at that load plain decoding beat every "
                "method it tried")
             + ". The last row is the layout with that server as tuned (its throughput and mean TPOT).", "",
             "| layout | GPUs | tok/s/GPU | tok/s/user | TTFT ms | TPOT ms |", "|---|---:|---:|---:|---:|---:|"]
    for mode, front in choice.plan.fronts.items():
        best = front[0] if front else None
        if best is not None:
            lines.append(_row(f"best {mode}", best))
    lines.append(_row("**chosen, with the tuned speculation**", tuned))
    lines += ["", "![Pareto fronts of both serving modes](cluster.png)", "",
              "Workers (node: GPU indices there): " + "; ".join(
                  f"{w['role']} {w['index']} on node {w['node']}: {','.join(map(str, w['gpus']))}" for w in where),
              "", "Start it with: " + ", ".join(f"`{s}`" for s in scripts) + " (each script's first lines say how)."]
    path.write_text(path.read_text() + "\n".join(lines) + "\n")


def _row(label: str, p: Layout) -> str:
    shape = (f"{p.replicas} x {worker_name(p.tp, p.attn_dp, p.ep)}, {p.batch} requests each" if p.mode == "agg" else
             f"{p.prefill_workers}P x {worker_name(p.prefill_tp, p.prefill_attn_dp, p.prefill_ep)} + "
             f"{p.decode_workers}D x {worker_name(p.decode_tp, p.attn_dp, p.ep)}, {p.decode_batch} requests each")
    return (f"| {label}: {p.mode}, {shape} | {p.gpus} | {p.tokens_per_s_gpu:,.1f} | {p.tokens_per_s_user:,.1f} | "
            f"{p.ttft_ms:,.0f} | {p.tpot_ms:.2f} |")
