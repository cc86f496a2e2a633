"""What tuning bought (issue 37, part 5): the tuned configuration beside the engine's own defaults for the same
method and beside no speculation, at the workload's load; and the predicted speedup of every method the deployment
can run against concurrency. Predictions of the study's own simulator (a simulated study only).

The engine-default row keeps what the study tuned outside speculation's defaults only where SGLang has no default
of its own (model, GPU, TP, weight and KV dtypes); the rest is SGLang 0.5.23's, read from its released code:
- draft length: EAGLE-family (EAGLE3, NEXTN, STANDALONE) `_auto_choose_speculative_params`: 3 steps, topk 1, 4 draft
  tokens, except Llama targets 5 steps, topk 4, 8 draft tokens (a tree); NGRAM 12 draft tokens (`_handle_ngram`,
  priced as an 11-token chain: the simulator has no n-gram tree); DSpark / DFlash the checkpoint's block; suffix
  (not in SGLang) vLLM's default 24 (`suffix_decoding_max_tree_depth`); else tuner/estimate.DEFAULT_STEPS;
- DSpark verifies the whole block (SGLANG_RAGGED_VERIFY_MODE defaults to static);
- at most 48 running requests when speculating (every speculative handler resets it), its CUDA-graph capture
  (tuner/catalog/spec_costs.yaml), and its chunked-prefill size and static memory fraction for this GPU and TP
  where the profile carries them (profiler/catalog/sglang_defaults.yaml).
The none row is the tuned configuration with speculation off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler.schema import Profile

SPEEDUP_CONCURRENCY = (1, 4, 16, 64)  # closed-loop clients the speedup plot is predicted at
PLOT_REQUESTS_PER_CLIENT = 4  # requests per client in a plot point (a point is a ratio: both arms share the draws)
SGLANG_STEPS = {"eagle3": 3, "mtp": 3, "draft_model": 3, "ngram": 11, "suffix": 24}  # see the module docstring
LLAMA_TREE = (5, 4, 8)  # SGLang's EAGLE default for LlamaForCausalLM: steps, topk, draft tokens


@dataclass
class Row:
    """One configuration of the side-by-side table."""

    label: str  # tuned | engine default | no speculation
    method: str
    steps: int  # draft tokens per round (0: none)
    how: str  # what the configuration is, in a few words
    metrics: dict[str, float]
    feasible: bool = True
    why: str = ""


def _sglang_running() -> int:
    """SGLang's cap on running requests when speculating without --max-running-requests (spec_costs.yaml)."""
    from tuner.methods import engine_costs

    return engine_costs("sglang").max_running


def default_steps(profile: Profile, method: str) -> tuple[int, int, int]:
    """SGLang's default (steps, topk, draft tokens) for `method` on this target (topk 1 / tokens 0: a chain)."""
    from tuner.estimate import DEFAULT_STEPS
    from tuner.spec_targets import architecture

    if method in ("eagle3", "mtp") and architecture(profile) == "LlamaForCausalLM":
        return LLAMA_TREE
    if method in ("dspark", "dflash"):
        d = profile.drafter
        block = d.block_size if d.method == method and d.block_size else None
        return int(block or DEFAULT_STEPS[method]), 1, 0
    return SGLANG_STEPS.get(method, DEFAULT_STEPS.get(method, 3)), 1, 0


def default_params(profile: Profile, params: dict[str, Any]) -> dict[str, Any]:
    """The engine-default configuration of the tuned method (see the module docstring)."""
    method = str(params.get("spec.method") or "dspark")
    steps, topk, tokens = default_steps(profile, method)
    d = profile.derived
    out = {**params, "spec.enabled": True, "spec.block_size": steps, "spec.max_verify_tokens": min(16, steps),
           "spec.scheduler": "verify_all", "spec.adaptive_gamma": False, "spec.gamma_policy": "static",
           "spec.fallback_acceptance": 0.0, "spec.topk": topk, "spec.draft_tokens": tokens,
           "batch.max_requests": _sglang_running(), "batch.cuda_graph_max_bs": 0}
    if d is not None and d.sglang_tp == int(params.get("parallel.tp", 1)):
        if d.sglang_chunked_prefill:
            out["batch.chunked_prefill"] = int(d.sglang_chunked_prefill)
        if d.sglang_static_fraction:
            out["memory.fraction_static"] = float(d.sglang_static_fraction)
    return out


def comparison(evaluator: Any, params: dict[str, Any], seed: int) -> list[Row]:
    """Tuned / engine defaults / no speculation at the workload's load, each as the study evaluates a trial."""
    method = str(params.get("spec.method") or "dspark") if params.get("spec.enabled", True) else "none"
    cases = [("tuned", params, "the exported configuration")]
    if method != "none":
        dflt = default_params(evaluator.profile, params)
        tree = f", topk {dflt['spec.topk']} / {dflt['spec.draft_tokens']} draft tokens" if dflt["spec.topk"] > 1 else ""
        cases.append(("engine default", dflt, f"SGLang's defaults for {method}: {dflt['spec.block_size']} draft "
                                              f"tokens{tree}, {_sglang_running()} running requests"))
    cases.append(("no speculation", {**params, "spec.enabled": False}, "the exported configuration, speculation off"))
    rows = []
    for label, p, how in cases:
        on = bool(p.get("spec.enabled", True))
        e = evaluator.evaluate(p, seed=seed)
        rows.append(Row(label, method if on else "none", int(p["spec.block_size"]) if on else 0, how, e.metrics,
                        e.feasible, e.why))
    return rows


def _at_concurrency(profile: Profile, clients: int) -> Profile:
    """The profile under a closed loop of `clients` (its request lengths kept)."""
    wl = profile.workload.model_copy(update={"concurrency": clients, "request_rate": None})
    return profile.model_copy(update={"workload": wl})


def speedup_curves(evaluator: Any, params: dict[str, Any], methods: list[str], k_max: int,
                   concurrency: tuple[int, ...] = SPEEDUP_CONCURRENCY) -> dict[str, list[tuple[int, float, int]]]:
    """Per method: [(concurrency, predicted speedup over no speculation, K)], each method at the draft length the
    batch-size schedule gives it at that load (tuner/schedule.py best_k, at most `k_max`; 0 turns it off: 1.0x)."""
    from tuner.method_schedule import mean_context
    from tuner.methods import drafting_of, engine_costs
    from tuner.schedule import best_k
    from tuner.simulate import simulate

    profile = evaluator.profile
    costs = engine_costs("sglang", profile.hw.arch)
    ctx = mean_context(profile)
    out: dict[str, list[tuple[int, float, int]]] = {m: [] for m in methods}
    for c in concurrency:
        prof = _at_concurrency(profile, c)
        base = {**params, "batch.max_requests": c, "batch.max_tokens": max(int(params["batch.max_tokens"]),
                                                                           c * (k_max + 1))}
        n = max(8, PLOT_REQUESTS_PER_CLIENT * c)
        plain_p = {**base, "spec.enabled": False}
        perf = evaluator.perf(plain_p)
        plain = simulate(plain_p, prof, perf, evaluator.drafting(plain_p)[0], n_requests=n, seed=0).throughput
        for m in methods:
            p = {**base, "spec.enabled": True, "spec.method": m, "spec.scheduler": params["spec.scheduler"]
                 if m == "dspark" else "verify_all", **({"spec.head": "none"} if m == "dflash" else {})}
            accept, draft = evaluator.drafting(p)
            k = best_k(perf, costs, drafting_of({**p, "spec.block_size": k_max}, profile, draft), accept, c, k_max,
                       ctx)[0]
            if k == 0 or not plain:
                out[m].append((c, 1.0, 0))
                continue
            p |= {"spec.block_size": k, "spec.max_verify_tokens": min(16, k)}
            r = simulate(p, prof, perf, accept, n_requests=n, seed=0, draft_shape=draft)
            out[m].append((c, r.throughput / plain if r.feasible else 0.0, k))
    return out


def plotted_methods(profile: Profile, params: dict[str, Any]) -> list[str]:
    """The methods the deployment can run (kb/method_choice.py; the tuned one when the profile does not say), the
    tuned one first; MTP only where the target ships its module."""
    from kb.method_choice import runnable_methods

    tuned = str(params.get("spec.method") or "dspark")
    got = runnable_methods(profile) or [tuned]
    if params.get("spec.enabled", True):
        got = [tuned] + [m for m in got if m != tuned]
    return [m for m in got if m != "mtp" or profile.model.mtp_modules]


def report_section(evaluator: Any, params: dict[str, Any], space: Any, seed: int, schedules: dict[str, Any],
                   plot_path: Any) -> dict[str, Any] | None:
    """The report's "What tuning bought" values (None for a measured or live study: no predictions there), and
    the speedup plot written to `plot_path`."""
    if getattr(evaluator, "mode", None) != "simulate":
        return None
    from tuner import plots

    rows = comparison(evaluator, params, seed)
    d = space.distributions.get("spec.block_size")
    k_max = int(getattr(d, "high", 0) or params["spec.block_size"])
    clients = evaluator.profile.workload.concurrency
    conc = tuple(sorted(set(SPEEDUP_CONCURRENCY) | ({int(clients)} if clients and clients <= 256 else set())))
    methods = plotted_methods(evaluator.profile, params)
    curves = speedup_curves(evaluator, params, methods, k_max, conc)
    plots.speedup(curves, str(evaluator.profile.hw.name or "GPU"), plot_path)
    none = next((r for r in rows if r.label == "no speculation"), None)
    base = none.metrics.get("throughput") if none is not None and none.feasible else None
    table = [{"label": r.label, "method": r.method, "steps": r.steps, "how": r.how, "feasible": r.feasible,
              "why": r.why, "throughput": r.metrics.get("throughput"), "tpot": r.metrics.get("tpot_p99_ms"),
              "ttft": r.metrics.get("ttft_p99_ms"), "tau": r.metrics.get("tau"),
              "speedup": r.metrics["throughput"] / base if base and r.feasible else None} for r in rows]
    return {"rows": table, "methods": methods, "concurrency": list(conc), "schedules": schedules,
            "curves": {m: [{"c": c, "speedup": s, "k": k} for c, s, k in v] for m, v in curves.items()}}
