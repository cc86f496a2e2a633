"""Evaluators: parameters -> metrics, by simulation (a modelled GPU) or measurement (this device).

A plug-in base in the Optuna spirit: `describe`, `evaluate` and `sps_table` are all a new
evaluator has to provide; the study only talks to this interface.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any

from profiler.schema import Profile

FOUR_BIT = ("int4", "nvfp4")  # weight formats that need `workload.quality: relaxed`
METRIC_UNITS = {"throughput": "tok/s/GPU", "tpot_p99_ms": "ms", "ttft_p99_ms": "ms", "tau": "tokens/round",
                "verify_tokens_per_step": "tokens", "cut_requests": "requests", "requests_per_s": "req/s",
                "rate_at_slo": "req/s", "failed_requests": "requests"}  # the unit of each metric key
OBJECTIVES: dict[str, tuple[str, str, str]] = {  # name -> (metric key, direction, label with its unit)
    "throughput": ("throughput", "maximize", "throughput (tok/s/GPU)"),  # output tokens per second per GPU
    "tpot_p99": ("tpot_p99_ms", "minimize", "p99 TPOT (ms)"),  # p99 time per output token
    "ttft_p99": ("ttft_p99_ms", "minimize", "p99 TTFT (ms)"),  # p99 time to first token
    "tau": ("tau", "maximize", "tau (tokens/round)"),  # accepted tokens per round
}


@dataclass
class Evaluation:
    metrics: dict[str, float]  # throughput, tpot_p99_ms, ttft_p99_ms, tau, ...
    feasible: bool = True  # the configuration can run at all (memory fit, valid combination)
    why: str = ""  # why not, when infeasible
    extra: dict[str, Any] = field(default_factory=dict)


class Evaluator(abc.ABC):
    """Turns a full parameter set into metrics."""

    mode: str  # "simulate" | "measure"

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for reports: what is evaluated, on what, with which acceptance source."""

    @abc.abstractmethod
    def evaluate(self, params: dict[str, Any], seed: int = 0) -> Evaluation:
        """Run (or model) the workload with `params`."""

    @abc.abstractmethod
    def sps_table(self, params: dict[str, Any]):  # -> dspark_core.verification.sps.SpsTable
        """The steps-per-second table to export with `params` (modelled or measured)."""


def moe_layout(params: dict[str, Any], tp: int, moe: bool) -> tuple[int, int]:
    """(attention-DP ranks, EP ranks) of a server of `tp` GPUs as the bundles launch it (tuner/targets.py):
    `parallel.dp_attention` gives every GPU its own attention replica (SGLang --attn-dp-size tp), `parallel.ep` the
    MoE's expert-parallel ranks (MoE TP = tp / EP; an EP that does not divide tp is priced at the largest that
    does). A dense model, or one GPU, runs plain TP."""
    if not moe or tp <= 1:
        return 1, 1
    dp = tp if params.get("parallel.dp_attention") else 1
    return dp, math.gcd(tp, max(1, int(params.get("parallel.ep") or 1)))


def _dtype(value: str, profile: Profile) -> str:
    if value in ("auto", None):
        return "fp32" if profile.hw.arch == "cpu" else "bf16"
    return value


class SimulateEvaluator(Evaluator):
    """The performance model of DESIGN.md section 5 driven by the engine's own schedulers."""

    mode = "simulate"

    def __init__(self, profile: Profile, n_requests: int | None = None, efficiency=None, repeats: int = 2,
                 cost: str = "roofline", calibration: dict[str, Any] | None = None, engine: str = "sglang",
                 decode_only: bool = False) -> None:
        from tuner.perf import Efficiency, Hardware, ModelShape

        self.profile = profile
        self.shape = ModelShape.from_profile(profile)
        self.hw = Hardware.from_profile(profile)
        if efficiency is None and calibration and calibration.get("efficiency"):
            efficiency = Efficiency(**calibration["efficiency"])
        self.eff = efficiency or Efficiency.prior(profile.hw)
        self.cost = cost  # "aic": price forwards from AIConfigurator's database where it covers them
        self.aic_engine = engine  # whose AIC kernel tables price them (tuner/catalog/aic.yaml backends)
        # live trials on this hardware (tuner/live/calibration.py): measured / simulated throughput, a time scale
        self.calibration = calibration
        self.decode_only = decode_only  # a disaggregated decode worker: prompts arrive prefilled (tuner/simulate.py)
        if cost == "aic":
            from tuner.aic import covers
            from tuner.errors import TunerError

            target, why = covers(profile, engine)
            if target is None:
                raise TunerError(f"--cost aic: {why}")
        # six requests per client of the closed loop: throughput is read between ramp-up and drain, a window of
        # ~4 request lengths (spread over simulation seeds ~2%; ~5% with three requests per client); at most 384
        # (the time a trial takes), but never under three per client: with fewer requests than clients the loop
        # never reaches its steady state (416 clients on 384 requests read 5,621 tok/s/GPU against 6,849 with 3 per
        # client, a disaggregated decode worker of Qwen3-8B on two H100s)
        clients = profile.workload.concurrency or 16
        self.n_requests = n_requests or min(max(48, 6 * clients), max(384, 3 * clients))
        # each evaluation is the mean of `repeats` simulations on independent request samples: one sample's
        # throughput moves ~0.7% from configuration to configuration by chance, and a search that keeps the best of
        # dozens of trials keeps that luck (the winner's curse); two samples shrink it by ~30% at twice the cost
        self.repeats = max(1, repeats)
        self._draft_shape = None  # a draft_model deployment's small model (built once, on first use)
        self.tau_scale = 1.0  # the acceptance's tau times this (the report's what-if on an assumed acceptance)

    def perf(self, params: dict[str, Any]):  # -> PerfModel
        """The performance model of `params`; its `cost_source` names what priced it."""
        return self.perf_why(params)[0]

    def perf_why(self, params: dict[str, Any]):  # -> tuple[PerfModel, str]
        """The performance model of `params`, and why AIC could not price it ("" when it did or was not asked)."""
        from tuner.perf import PerfModel

        tp = int(params.get("parallel.tp", 1))
        dp, ep = moe_layout(params, tp, bool(self.shape.num_experts))
        base = PerfModel(self.shape, self.hw, self.eff, weights_dtype=_dtype(params.get("weights.dtype"), self.profile),
                         kv_dtype=_dtype(params.get("kv.dtype"), self.profile), tp=tp,
                         cuda_graph_max_bs=int(params.get("batch.cuda_graph_max_bs") or 0), attn_dp=dp, ep=ep)
        if self.cost != "aic":
            return base, ""
        from tuner.aic import aic_perf

        return aic_perf(base, self.profile, self.aic_engine)

    def cost_label(self) -> str:
        """The cost source for reports: aic:<system>/<backend>/<version>, or roofline (with its priors)."""
        if self.cost == "aic":
            from tuner.aic import resolve

            target, _ = resolve(self.profile, self.aic_engine)
            if target is not None:
                return f"{target.source()} (a dtype it has not timed: its nearest timed one x the roofline ratio)"
        return f"roofline ({self.eff.source})"

    def describe(self) -> str:
        from tuner.acceptance import acceptance_for

        src = acceptance_for(self.profile, "markov").source
        cal = f"; times scaled by {self.calibration['source']}" if self.calibration else ""
        return (f"simulated {self.profile.model.name or 'model'} on {self.hw.name or 'hardware'} "
                f"(cost: {self.cost_label()}; acceptance {src}{cal})")

    def drafting(self, params: dict[str, Any]):  # -> tuple[AcceptanceModel, ModelShape | None]
        """The acceptance of the method `params` run (spec.method: DSpark's by head and depth, the others' published
        figures) and, for a draft model, the small model's shape (tuner/estimate.py draft_model_shape)."""
        from tuner.acceptance import acceptance_of
        from tuner.methods import drafting_of

        method = drafting_of(params, self.profile).method
        head, layers = str(params["spec.head"]), int(params["spec.draft_layers"])
        accept = acceptance_of(self.profile, "dspark" if method == "none" else method, head, layers)
        if self.tau_scale != 1.0 and method != "none":
            from tuner.acceptance import with_tau

            k = int(params["spec.block_size"])
            accept = with_tau(accept, accept.tau(k) * self.tau_scale, k, f"{accept.source}, tau x {self.tau_scale:g}")
        if method != "draft_model":
            return accept, None
        if self._draft_shape is None:
            from tuner.estimate import draft_model_shape

            self._draft_shape = draft_model_shape(self.profile, self.profile.hw.name or "h100")[0]
        return accept, self._draft_shape

    def evaluate(self, params: dict[str, Any], seed: int = 0) -> Evaluation:
        from tuner.simulate import simulate

        # FP8 weights run weight-only (W8A16, vLLM's Marlin) without FP8 tensor cores; an FP8 KV cache is not modelled
        if str(params.get("kv.dtype", "")).startswith("fp8") and self.profile.hw.fp8 is False:
            return Evaluation({}, False, f"{self.hw.name} has no FP8 tensor cores for an FP8 KV cache")
        four_bit = params.get("weights.dtype") in FOUR_BIT
        if four_bit and self.profile.workload.quality != "relaxed":
            return Evaluation({}, False, f"{params['weights.dtype']} weights are below the workload's accuracy floor "
                                         "(profile --quality relaxed allows 4-bit weights)")
        count = self.profile.hw.count or 8
        if int(params.get("parallel.tp", 1)) > count:
            return Evaluation({}, False, f"tp {params['parallel.tp']} exceeds the {count} devices available")
        if params.get("spec.enabled") and params.get("spec.method") == "mtp" and not self.profile.model.mtp_modules:
            return Evaluation({}, False, f"{self.profile.model.name} ships no MTP module (num_nextn_predict_layers)")
        accept, draft = self.drafting(params)
        perf, fallback = self.perf_why(params)
        if self.cost == "aic" and fallback:  # one cost model per study: never a roofline point among AIC's
            return Evaluation({}, False, f"AIC cannot price this point: {fallback}", {"cost_source": "none"})
        cost = perf.cost_source + (f" ({fallback})" if fallback else "")
        runs = [simulate(params, self.profile, perf, accept, n_requests=self.n_requests, seed=seed * self.repeats + i,
                         draft_shape=draft, decode_only=self.decode_only)
                for i in range(self.repeats)]  # seed s uses samples s*k .. s*k+k-1: other seeds share none
        bad = next((r for r in runs if not r.feasible), None)
        if bad is not None:
            return Evaluation({}, False, bad.why_infeasible, {**bad.extra, "cost_source": cost})
        keys = ("throughput", "tpot_p99_ms", "ttft_p99_ms", "tpot_mean_ms", "tau", "verify_tokens_per_step")
        metrics = {k: sum(getattr(r, k) for r in runs) / len(runs) for k in keys}
        if self.calibration:  # one time scale for every step: throughput up by it, latencies down
            k = float(self.calibration["scale"])
            metrics["throughput"] *= k
            for key in ("tpot_p99_ms", "ttft_p99_ms", "tpot_mean_ms"):
                metrics[key] /= k
        return Evaluation(metrics, True, "", {**runs[0].extra, "samples": len(runs), "cost_source": cost})

    def sps_table(self, params: dict[str, Any]):
        from tuner.simulate import sps_table

        w = self.profile.workload
        ctx = (w.prompt_len.mean or w.prompt_len.p50 or 512) if w.prompt_len else 512
        gamma = int(params["spec.block_size"])
        budget = min(int(params["batch.max_tokens"]), int(params["batch.max_requests"]) * (gamma + 1))
        return sps_table(self.perf(params), max(2, budget), ctx, int(params["batch.max_requests"]))
