"""The memoised score of benchmarks/bench_search.py: simulated output tokens/s per GPU of a full parameter set, or 0
when infeasible or off its SLOs, shared by every search method of a case (see bench_search's docstring, step 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every parameter the simulator reads (checked on every evaluation: reading another one raises).
SENSITIVE: tuple[str, ...] = (
    "spec.enabled", "spec.block_size", "spec.head", "spec.scheduler", "spec.confidence_threshold",
    "spec.max_verify_tokens", "spec.fallback_acceptance", "spec.adaptive_gamma", "spec.draft_layers",
    "spec.markov_rank", "spec.gamma_policy", "spec.method",
    "batch.max_requests", "batch.max_tokens", "batch.chunked_prefill", "batch.timeout_ms",
    "batch.cuda_graph_max_bs", "memory.fraction_static", "kv.dtype", "weights.dtype", "parallel.tp",
)


class _Recorder(dict):
    """A parameter dict that fails loudly when the simulator reads a key outside SENSITIVE."""

    def _check(self, key: str) -> None:
        if key not in SENSITIVE:
            raise RuntimeError(f"simulator read {key!r}, which search_scorer.SENSITIVE does not list; add it")

    def __getitem__(self, key: str) -> Any:
        self._check(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._check(key)
        return super().get(key, default)


@dataclass
class Scorer:
    """Memoised single-objective score of a full parameter set (see module docstring, step 2)."""

    evaluator: Any  # tuner.objective.SimulateEvaluator
    slo_tpot_ms: float | None
    slo_ttft_ms: float | None
    sim_seed: int = 0
    held: dict[str, Any] = field(default_factory=dict)  # the deployed drafter checkpoint's properties (every method)
    block_cap: int | None = None  # the block the checkpoint was trained for: it drafts no further
    memo: dict[tuple, tuple[float, dict[str, float]]] = field(default_factory=dict)
    calls: int = 0  # simulator runs (memo misses)

    def key(self, params: dict[str, Any]) -> tuple:
        return tuple(params.get(k) for k in SENSITIVE)

    def deployable(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` as the checkpoint runs them: its head and depth, at most its trained block."""
        p = {**params, **self.held}
        if self.block_cap and int(p.get("spec.block_size", 0)) > self.block_cap:
            p["spec.block_size"] = self.block_cap
        return p

    def __call__(self, params: dict[str, Any]) -> float:
        return self.evaluate(params)[0]

    def evaluate(self, params: dict[str, Any]) -> tuple[float, dict[str, float]]:
        """(score, the Optuna constraint values `tune` would record for this configuration)."""
        from tuner.study import slo_constraints

        params = self.deployable(params)
        k = self.key(params)
        if k not in self.memo:
            self.calls += 1
            ev = self.evaluator.evaluate(_Recorder(params), seed=self.sim_seed)
            cons = slo_constraints(ev, self.slo_tpot_ms, self.slo_ttft_ms)
            ok = ev.feasible and ev.metrics.get("throughput", 0.0) > 0 and all(v <= 0 for v in cons.values())
            self.memo[k] = (float(ev.metrics["throughput"]) if ok else 0.0, cons)
        return self.memo[k]
