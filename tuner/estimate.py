"""`estimate`: a what-if on the tuner's own simulator (like AIConfigurator's `cli estimate`), for one deployment
of one method at one load: per-GPU throughput, TPOT, TTFT, tau, and the speedup over the same deployment with
`--method none`, every forward priced by the cost source a study would use (AIC's measured kernels where the `aic`
extra covers the model and GPU, else the roofline) and every round as the engine runs the method
(tuner/methods.py).

The load is a closed loop of `concurrency` clients, each sending requests of `isl` prompt and `osl` output
tokens; throughput is read in the steady state between ramp-up and drain, as in a study. The engine is SGLang
(the simulator's reference engine) with its defaults for the method: when speculating it runs at most 48 requests
and captures CUDA graphs up to there (tuner/catalog/spec_costs.yaml); a bench on published rows may name another
engine, whose round costs, defaults and (where AIC timed that engine) kernel tables then price it. The acceptance
is `tau` when given (the method's published per-position shape scaled to it), else the model's catalogued drafter
for the method, else the method's published prior.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from profiler.schema import Lengths
from tuner.errors import TunerError
from tuner.methods import METHODS, engine_costs

REQUESTS_PER_CLIENT = 4  # closed-loop requests per client: a steady window between ramp-up and drain


@dataclass(frozen=True)
class Case:
    """One estimate's inputs (the CLI's options)."""

    model: str
    gpu: str
    gpus: int | None = None  # devices of the deployment (default: tp)
    tp: int | None = None  # tensor parallelism (default: gpus, else 1)
    dtype: str = "auto"  # weight dtype (auto: the checkpoint's)
    concurrency: int = 1
    isl: int = 1024
    osl: int = 1024
    method: str = "none"
    steps: int | None = None  # draft tokens per round (K); default: the method's usual depth
    topk: int = 1  # EAGLE tree branching
    draft_tokens: int = 0  # EAGLE tree: tokens verified per request (incl. the root)
    tau: float | None = None  # accepted tokens per round incl. the bonus
    engine: str = "sglang"  # whose round costs, defaults and AIC kernel tables (the CLI keeps sglang)
    kv_dtype: str = "auto"
    cost: str = "auto"  # auto | aic | roofline


DEFAULT_STEPS = {"dspark": 7, "dflash": 7, "eagle3": 3, "mtp": 3, "draft_model": 4, "ngram": 4, "suffix": 8}


def check(case: Case) -> None:
    """One TunerError line for an option that cannot work."""
    if case.method not in METHODS:
        raise TunerError(f"--method {case.method!r}: choose {', '.join(METHODS)}")
    for name in ("concurrency", "isl", "osl"):
        if getattr(case, name) < 1:
            raise TunerError(f"--{name} {getattr(case, name)}: give at least 1")
    if case.steps is not None and not 0 <= case.steps <= 64:
        raise TunerError(f"--steps {case.steps}: give 0-64 draft tokens per round")
    if case.method == "none" and (case.steps or case.tau):
        raise TunerError("--method none drafts nothing: drop --steps / --tau")
    k = case.steps if case.steps is not None else DEFAULT_STEPS.get(case.method, 0)
    if case.tau is not None and not 1.0 <= case.tau <= k + 1:
        raise TunerError(f"--tau {case.tau}: mean accepted tokens per round incl. the bonus lies in [1, {k + 1}] at "
                         f"--steps {k}")
    if case.topk < 1 or (case.topk > 1 and case.method != "eagle3"):
        raise TunerError(f"--topk {case.topk}: a tree (topk > 1) is EAGLE-3's; give 1 or --method eagle3")
    if case.draft_tokens and (case.method != "eagle3" or case.draft_tokens < 2):
        raise TunerError(f"--draft-tokens {case.draft_tokens}: EAGLE-3's tree verifies at least 2 tokens per request")
    for name in ("gpus", "tp"):
        v = getattr(case, name)
        if v is not None and not 1 <= v <= 1024:
            raise TunerError(f"--{name} {v}: give 1-1024")
    if case.gpus and case.tp and case.gpus % case.tp:
        raise TunerError(f"--gpus {case.gpus} is not a multiple of --tp {case.tp}")


def estimate(case: Case, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The case's predicted metrics, the same deployment without speculation, and their ratio. `base`: that
    deployment's metrics from an earlier call (a fit of the speculative constants reprices only the method)."""
    check(case)
    from profiler.build import build_profile

    gpus = case.gpus or case.tp or 1
    tp = case.tp or gpus
    profile = build_profile(case.model, case.gpu, "chat", measure=False, entropy=False, gpus=gpus)
    if case.method == "mtp" and not (profile.model.mtp_modules or 0):
        raise TunerError(f"--method mtp: {profile.model.name} declares no MTP modules (num_nextn_predict_layers); "
                         "give eagle3, draft_model, ngram or suffix")
    wl = profile.workload
    wl.prompt_len = Lengths(mean=case.isl, p50=case.isl, p99=case.isl)
    wl.output_len = Lengths(mean=case.osl, p50=case.osl, p99=case.osl)
    wl.concurrency, wl.request_rate, wl.slo = case.concurrency, None, None
    draft, draft_why = draft_model_shape(profile, case.gpu) if case.method == "draft_model" else (None, None)
    spec = _run(profile, case, tp, case.method, draft)
    base = base or _run(profile, case, tp, "none")
    out = {"case": asdict(case), **spec, "none": base,
           "speedup": round(spec["throughput"] / base["throughput"], 4) if base["throughput"] else None}
    out["replicas"] = max(1, gpus // tp)
    if draft_why:
        out["draft_model"] = draft_why
    return out


def draft_model_shape(profile: Any, gpu: str) -> tuple[Any, str]:
    """The small model a `draft_model` deployment of this target drafts with, as the kernel model's shape, and
    which one: the model's published pairing (profiler/catalog/drafters.yaml), else the smallest catalogue model
    sharing its vocabulary at most an eighth of its size, else Qwen3-0.6B's shape with the target's vocabulary
    (a what-if: no such draft is published)."""
    from dataclasses import replace

    from profiler.build import build_profile
    from profiler.catalog import models, published_drafter
    from tuner.perf import ModelShape

    m = profile.model
    pub = published_drafter(m.name, "draft_model")
    name = pub.draft_model if pub is not None and pub.draft_model else None
    why = f"{name} (published pairing: {pub.id})" if name and pub is not None else ""
    if name is None:
        same = [e for e in models() if e.config.get("vocab_size") == m.vocab_size and e.name != m.name
                and e.published.params_total <= (m.params_total or 0) / 8]
        if same:
            name = min(same, key=lambda e: e.published.params_total).name
            why = f"{name} (the smallest catalogue model sharing the {m.vocab_size}-token vocabulary)"
    if name is not None:
        return ModelShape.from_profile(build_profile(name, gpu, "chat", measure=False, entropy=False)), why
    small = ModelShape.from_profile(build_profile("Qwen3-0.6B", gpu, "chat", measure=False, entropy=False))
    extra = float((m.vocab_size - small.vocab) * small.hidden)
    return replace(small, vocab=m.vocab_size, lm_head=small.lm_head + extra, params_active=small.params_active + extra,
                   params_total=small.params_total + extra, stored_bytes=()), (
        f"no published or same-vocabulary draft for {m.name}: Qwen3-0.6B's shape with its {m.vocab_size}-token "
        "vocabulary (a what-if)")


def _run(profile: Any, case: Case, tp: int, method: str, draft: Any = None) -> dict[str, Any]:
    from tuner.acceptance import acceptance_of, with_tau
    from tuner.objective import SimulateEvaluator
    from tuner.space import engine_defaults

    k = 0 if method == "none" else (case.steps if case.steps is not None else DEFAULT_STEPS[method])
    costs = engine_costs(case.engine, profile.hw.arch)
    running = case.concurrency
    if k and costs.max_running:
        running = min(running, costs.max_running)
    params = engine_defaults() | {
        "spec.enabled": k > 0, "spec.method": method if k else "dspark", "spec.block_size": max(k, 1),
        "spec.scheduler": "verify_all", "spec.topk": case.topk, "spec.draft_tokens": case.draft_tokens,
        "spec.max_verify_tokens": max(k, 1), "spec.adaptive_gamma": False, "spec.fallback_acceptance": 0.0,
        "batch.max_requests": running, "batch.max_tokens": max(16384, running * (max(case.draft_tokens, k) + 1)),
        "batch.chunked_prefill": 8192, "batch.timeout_ms": 0.0, "batch.cuda_graph_max_bs": 0,
        "weights.dtype": case.dtype, "kv.dtype": case.kv_dtype, "parallel.tp": tp, "memory.fraction_static": 0.88}
    if method == "dspark":
        params["spec.head"] = "markov"
    if method == "dflash":
        params["spec.head"] = "none"
    cost = resolved_cost(case.cost, profile, case.engine)
    ev = SimulateEvaluator(profile, n_requests=REQUESTS_PER_CLIENT * case.concurrency, repeats=2, cost=cost,
                           engine=case.engine)
    perf, why = ev.perf_why(params)
    accept = acceptance_of(profile, method, str(params.get("spec.head", "markov")),
                           int(params.get("spec.draft_layers") or 1))
    if case.tau is not None and k:
        accept = with_tau(accept, case.tau, k, f"given: tau {case.tau} at {k} draft tokens ({accept.source})")
    from tuner.simulate import simulate

    runs = [simulate(params, profile, perf, accept, n_requests=ev.n_requests, seed=s, engine=case.engine,
                     draft_shape=draft)
            for s in range(ev.repeats)]
    bad = next((r for r in runs if not r.feasible), None)
    if bad is not None:
        raise TunerError(f"{case.model} on {case.gpu} x{tp} ({case.dtype}): {bad.why_infeasible}")
    n = len(runs)
    return {"method": method, "steps": k, "running": running,
            "throughput": round(sum(r.throughput for r in runs) / n, 2),
            "tpot_ms": round(sum(r.tpot_mean_ms for r in runs) / n, 3),
            "tpot_p99_ms": round(sum(r.tpot_p99_ms for r in runs) / n, 3),
            "ttft_ms": round(sum(r.extra["ttft_mean_ms"] for r in runs) / n, 2),
            "ttft_p99_ms": round(sum(r.ttft_p99_ms for r in runs) / n, 2),
            "tau": round(sum(r.tau for r in runs) / n, 3) if k else 1.0,
            "acceptance": accept.source if k else None,
            "cost_source": perf.cost_source + (f" ({why})" if why else "")}


def resolved_cost(cost: str, profile: Any, engine: str = "sglang") -> str:
    """`cost` (auto | aic | roofline) as it prices `profile`: auto is AIC's tables where they cover the model."""
    if cost != "auto":
        return cost
    return "aic" if _aic_covers(profile, engine) else "roofline"


def _aic_covers(profile: Any, engine: str = "sglang") -> bool:
    try:
        from tuner.aic import covers
    except ImportError:
        return False
    try:
        return covers(profile, engine)[0] is not None
    except Exception:  # noqa: BLE001 - the extra is optional; any failure of it means the roofline prices
        return False
