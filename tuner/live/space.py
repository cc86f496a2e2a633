"""The searched space of a live study: the plan's space restricted to what the launched engine reads and runs.

A parameter the engine does not read (params.yaml `readers`) is not searched against it: trials that differ only
there would measure the same server. It keeps the plan's preferred or default value, as the export writes it. A
choice the engine build cannot run (vLLM's CPU build has no DSpark proposer; quantised formats need a quantised
checkpoint) is dropped; the engine's own knobs (`spec.method`) are searched over what it runs.
"""

from __future__ import annotations

from typing import Any

from kb.params import param_spec
from tuner.space import SearchSpace


def engine_space(space: SearchSpace, spec) -> SearchSpace:  # noqa: ANN001 - tuner.study.StudySpec
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from tuner.live.engines import engine_class
    from tuner.measure import _checkpoint

    profile = spec.profile_model()
    engine = engine_class(spec.engine)(profile, _checkpoint(profile), spec.engine_python, spec.draft)
    narrow = engine.narrow()
    dists: dict[str, Any] = {}
    defaults = dict(space.defaults)
    fixed = dict(space.fixed)
    for name, d in space.distributions.items():
        p = param_spec(name)
        reads = engine.reader in (p.readers if p else ()) or (name.startswith("kernel.") and engine.reader == "engine")
        if not reads:
            defaults[name] = space.warm_start.get(name, _first(d))
            continue
        if name in narrow and isinstance(d, CategoricalDistribution):
            keep = [c for c in d.choices if c in narrow[name]]
            if name == "spec.method" and "draft_model" in narrow[name] and "draft_model" not in keep:
                keep.append("draft_model")  # tune --draft gives the deployment a draft model the profile did not list
            if not keep:
                fixed[name] = narrow[name][0]
                continue
            d = CategoricalDistribution(keep) if len(keep) > 1 else None
            if d is None:
                fixed[name] = keep[0]
                continue
        dists[name] = d
    for name, values in narrow.items():  # the engine's own knobs the plan does not search
        if name in dists or name in space.distributions:
            continue
        current = fixed.get(name, defaults.get(name))
        if current in values and len(values) == 1:
            continue
        if len(values) > 1:
            dists[name] = CategoricalDistribution(list(values))
            fixed.pop(name, None)
            defaults.pop(name, None)
        else:
            fixed[name] = values[0]
    cap = dists.get("batch.max_requests")
    clients = spec.live_concurrency or profile.workload.concurrency
    if spec.live_load == "closed" and isinstance(cap, IntDistribution) and clients and cap.high > clients:
        # a closed loop never has more than its clients in flight: a higher running-request cap changes nothing a
        # trial can see, and every value is another server start
        dists["batch.max_requests"] = IntDistribution(cap.low, max(cap.low, int(clients)), log=cap.log)
    warm = {k: v for k, v in space.warm_start.items() if k in dists and v in getattr(dists[k], "choices", [v])}
    return SearchSpace(dists, fixed, defaults, warm, space.running_cap)


def _first(d) -> Any:  # noqa: ANN001 - optuna distribution
    from optuna.distributions import CategoricalDistribution

    return d.choices[0] if isinstance(d, CategoricalDistribution) else d.low
