"""Plan -> Optuna search space: fixed stays fixed, ranges and choices become distributions.

Parameters the plan does not mention keep the engine's defaults (dspark_core/config.py), so the
full parameter set of every trial is `defaults | plan.fixed | sampled`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kb.match import Plan, SpaceEntry
from kb.params import all_params, param_spec

MAX_GRID = 64  # an int range with excluded values becomes categorical up to this many values


def engine_defaults() -> dict[str, Any]:
    """Every tunable parameter at the bundled engine's default (or its params.yaml default), by dotted name."""
    from dspark_core.config import EngineConfig

    cfg = EngineConfig().model_dump(mode="json")
    out: dict[str, Any] = {}
    for name, spec in all_params().items():
        section, _, key = name.partition(".")
        if isinstance(cfg.get(section), dict) and key in cfg[section]:
            out[name] = cfg[section][key]
        elif spec.default is not None:  # a drafter-design parameter: not an engine field, a modelled default
            out[name] = spec.default
    return out


def _distribution(name: str, e: SpaceEntry):  # -> optuna.distributions.BaseDistribution
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if e.kind == "choices":
        return CategoricalDistribution(list(e.choices or []))
    spec = param_spec(name)
    is_int = spec is not None and spec.type == "int"
    if is_int:
        lo, hi = int(e.low), int(e.high)
        step = int(e.step or 1)
        if e.exclude:
            values = [v for v in range(lo, hi + 1, step) if v not in e.exclude]
            if len(values) <= MAX_GRID:
                return CategoricalDistribution(values)
        return IntDistribution(lo, hi, step=1 if e.log else step, log=bool(e.log))
    return FloatDistribution(float(e.low), float(e.high), step=None if e.log else e.step, log=bool(e.log))


@dataclass
class SearchSpace:
    """What a study searches, what it fixes, and where it starts."""

    distributions: dict[str, Any]  # param -> optuna distribution
    fixed: dict[str, Any]  # param -> value (plan.fixed)
    defaults: dict[str, Any]  # param -> engine default (neither fixed nor searched)
    warm_start: dict[str, Any]  # plan.prefer restricted to searched params
    running_cap: int = 0  # closed-loop clients of the workload: more running requests never run (0: open loop)
    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # param -> the spec.method values that read it
    # (absent: every method); the screen does not move a param the point's method does not read

    def params_of(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """The full parameter set of a trial, bounded as the engines bound it (`consistent`): what a trial runs,
        scores and exports is one configuration."""
        return consistent({**self.defaults, **self.fixed, **sampled}, self.running_cap)

    def suggest(self, trial) -> dict[str, Any]:  # trial: optuna.Trial
        return self.params_of({n: _suggest(trial, n, d) for n, d in self.distributions.items()})


def closed_loop_clients(workload) -> int:
    """How many requests a closed-loop workload keeps in flight (0 for an open-loop one: arrivals at a rate)."""
    return 0 if workload.request_rate else int(workload.concurrency or 0)


def consistent(params: dict[str, Any], running_cap: int = 0) -> dict[str, Any]:
    """`params` with each setting past the bound another one sets brought to that bound, where the engines would run
    it so anyway: a prefill chunk never holds more than one forward's tokens (SGLang's --max-prefill-tokens caps
    it), CUDA graphs for more requests than may run are captured for nothing (memory and start-up time), and a
    closed-loop workload of `running_cap` clients never runs more requests than that. The exported scripts then say
    what runs (a chunk of 10240 beside 8192 prefill tokens, graphs for 544 requests beside a cap of 256, a cap of
    1024 for 64 clients, were all exported before). `spec.method: plain` (a measured study's choice) is speculation
    off."""
    out = dict(params)
    if out.get("spec.method") == "plain":
        out["spec.enabled"] = False
    if running_cap and int(out.get("batch.max_requests") or 0) > running_cap:
        out["batch.max_requests"] = running_cap
    tokens, chunk = int(out.get("batch.max_tokens") or 0), int(out.get("batch.chunked_prefill") or 0)
    if tokens and chunk > tokens:
        out["batch.chunked_prefill"] = tokens
    running, graph = int(out.get("batch.max_requests") or 0), int(out.get("batch.cuda_graph_max_bs") or 0)
    if running and graph > running:
        out["batch.cuda_graph_max_bs"] = running
    return out


def _suggest(trial, name: str, d) -> Any:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(name, d.choices)
    if isinstance(d, IntDistribution):
        return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    return trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)


def _kernel_distribution(name: str, e: SpaceEntry):  # -> CategoricalDistribution
    """A `kernel.<name>.<knob>` range means the kernel's declared values inside it (Triton block sizes are
    powers of two, not any integer); powers of two in the range when the knob is not declared."""
    from optuna.distributions import CategoricalDistribution

    _, kernel, knob = name.split(".", 2)
    try:
        from dspark_core.kernels.registry import get_entry

        declared = list(get_entry(kernel).spec.space.get(knob, ()))
    except (KeyError, ValueError, ImportError):
        declared = []
    if e.kind == "choices":
        values = [v for v in (e.choices or []) if not declared or v in declared]
    else:
        pool = declared or [2**i for i in range(0, 21)]
        values = [v for v in pool if e.low <= v <= e.high and v not in e.exclude]
    return CategoricalDistribution(values or list(e.choices or [int(e.low)]))


def space_from_plan(plan: Plan, tune_kernels: bool = False) -> SearchSpace:
    """`tune_kernels`: search `kernel.*` knobs too (only where the evaluator can see them: measurements on
    a GPU); otherwise they are left to `tune-kernels` and the kernels' per-architecture defaults."""
    dists = {}
    for name, e in sorted(plan.space.items()):
        if name.startswith("kernel."):
            if tune_kernels:
                dists[name] = _kernel_distribution(name, e)
            continue
        dists[name] = _distribution(name, e)
    fixed = {k: v.value for k, v in plan.fixed.items()}
    warm = {}
    for k, p in plan.prefer.items():
        if k in dists and dists[k]._contains(dists[k].to_internal_repr(p.value)):
            warm[k] = p.value
    # a preference on a parameter nobody searches or fixes is the value to use (a soft default)
    soft = {k: p.value for k, p in plan.prefer.items() if k not in dists and k not in fixed}
    defaults = {**{k: v for k, v in engine_defaults().items() if k not in fixed and k not in dists}, **soft}
    return SearchSpace(dists, fixed, defaults, warm)


def registry_distribution(name: str):  # -> optuna distribution | None
    """The parameter's whole registry domain as a distribution (None for open-ended parameters)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    spec = param_spec(name)
    if spec is None:
        return None
    if spec.type == "bool":
        return CategoricalDistribution([False, True])
    if spec.domain is None:
        return None
    if spec.type == "cat":
        return CategoricalDistribution(list(spec.domain))
    if spec.type == "int":
        return IntDistribution(int(spec.domain[0]), int(spec.domain[1]))
    return FloatDistribution(float(spec.domain[0]), float(spec.domain[1]))


def unrestricted_space(plan: Plan, extra: tuple[str, ...] = ()) -> SearchSpace:
    """The plan's parameters (and `extra` ones) over their whole registry domains: a search without rules."""
    dists = {n: d for n in sorted(set(plan.space) | set(plan.fixed) | set(extra))
             if (d := registry_distribution(n)) is not None}
    defaults = {k: v for k, v in engine_defaults().items() if k not in dists}
    return SearchSpace(dists, {}, defaults, {})


def with_plain(space: SearchSpace) -> SearchSpace:
    """`space` with plain decoding (`spec.method: plain`, speculation off) among the searched methods (beside the
    one method a deployment runs, where the plan fixes it), unless something fixes or searches `spec.enabled`:
    speculation that loses at the workload's load (a big decode batch on a GPU) is then a choice the study can
    drop, not one the bundle keeps."""
    from optuna.distributions import CategoricalDistribution

    if "spec.enabled" in space.fixed or "spec.enabled" in space.distributions:
        return space
    method = space.distributions.get("spec.method")
    fixed = dict(space.fixed)
    if method is not None:
        choices = list(method.choices)
    elif fixed.get("spec.method") not in (None, "plain"):  # the one method the deployment runs, or none at all
        choices = [fixed.pop("spec.method")]
    else:
        return space
    if "plain" in choices:
        return space
    dists = {**space.distributions, "spec.method": CategoricalDistribution([*choices, "plain"])}
    return SearchSpace(dists, fixed, space.defaults, space.warm_start, space.running_cap)


LOW_ACCEPTANCE_OFF = "spec.disable.very-low-acceptance"  # the rule that turns speculation off on a drafter's tau


def methods_decide(space: SearchSpace, plan: Plan) -> SearchSpace:
    """`space` without the fixed `spec.enabled: false` where the only rule fixing it is the low-acceptance one and
    the study searches several methods: that rule reads the profiled drafter's tau, not n-gram's or suffix's, so
    fixing speculation off made every searched method inert (a chat study on SmolLM2 "searched" DSpark, n-gram,
    suffix and the hybrid and ran plain decoding in all 14 trials). Speculation off stays where the rule points,
    as the study's starting point (`spec.method: plain`, which `with_plain` / the measured space add), and the
    trials decide."""
    entry = plan.fixed.get("spec.enabled")
    method = space.distributions.get("spec.method")
    if entry is None or entry.value is not False or entry.rules != [LOW_ACCEPTANCE_OFF] or method is None \
            or len(method.choices) < 2:
        return space
    fixed = {k: v for k, v in space.fixed.items() if k != "spec.enabled"}
    defaults = {**space.defaults, "spec.enabled": True}  # on, unless the trial's method is plain (`consistent`)
    return SearchSpace(dict(space.distributions), fixed, defaults, {**space.warm_start, "spec.method": "plain"},
                       space.running_cap)


def fixed_at_start(space: SearchSpace, names: tuple[str, ...]) -> SearchSpace:
    """`space` with `names` no longer searched: each fixed at its starting point (the plan's preferred value, else
    its first choice). For parameters the study's cost model cannot tell apart (EP under the roofline), whose
    searched value would be whichever trial happened to win on the others."""
    dists, fixed = dict(space.distributions), dict(space.fixed)
    for name in names:
        d = dists.pop(name, None)
        if d is not None:
            fixed[name] = space.warm_start.get(name, getattr(d, "choices", (getattr(d, "low", None),))[0])
    warm = {k: v for k, v in space.warm_start.items() if k in dists}
    return SearchSpace(dists, fixed, space.defaults, warm, space.running_cap)
