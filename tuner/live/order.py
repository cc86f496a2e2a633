"""The order of a live study's trials: restarts are what it spends its time on, so the settings a running server
takes without one (params.yaml `hot`) are varied within one server life. The screen (tuner/design.py) runs a few hot
moves on each server it starts for a new best point; after it, each newly started server gets trials that vary only
the hot settings (`hot_siblings`); the evaluator reconfigures the server for them instead of restarting it."""

from __future__ import annotations

from tuner.objective import Evaluator
from tuner.space import SearchSpace


def hot_knobs(evaluator: Evaluator, space: SearchSpace) -> tuple[str, ...]:
    """The searched parameters the study's engine takes on a running server (none outside a live study)."""
    engine = getattr(evaluator, "engine", None)
    return tuple(sorted(engine.hot_names(dict.fromkeys(space.distributions)))) if engine is not None else ()


def hot_siblings(study, space: SearchSpace, evaluator: Evaluator, trial, n: int) -> int:  # noqa: ANN001
    """After a live trial that started its own server, queue `n` trials that keep its other parameters and let
    the sampler choose the hot ones (params.yaml `hot`): they run on that server, reconfigured, without a restart
    (restarts are what a live study spends its time on). Returns how many it queued."""
    engine = getattr(evaluator, "engine", None)
    if engine is None or n <= 0 or trial.user_attrs.get("reused_server", True) or not trial.params:
        return 0
    hot = engine.hot_names(engine.seen(dict(trial.params))) & set(space.distributions)  # none with speculation off
    if not hot:
        return 0
    for _ in range(n):
        study.enqueue_trial({k: v for k, v in trial.params.items() if k not in hot})
    return n
