"""The study's first trials: the rules' preferred point, then a coordinate screen of the main knobs.

TPE models nothing until it has seen trials, and its random start-up trials spend a small budget on
corners the rules already advise against. The rules' preferred values are the best single guess, so the
study starts there (trial 0, every searched parameter set) and then screens the main knobs one at a time
from the best point so far (every other choice of a categorical knob, the ends and log-spaced middles of
a range), keeping a move when it scores better. These trials also teach TPE which knobs matter before it
samples on its own. Only the knobs DESIGN.md section 3 puts first are screened; the rest stay at the
preferred point until TPE moves them. Measured effect: `python benchmarks/bench_search.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tuner.space import SearchSpace, engine_defaults

SCREEN = (  # screened knobs, most influential first (block length and batch size move throughput most)
    "spec.block_size", "batch.max_requests", "parallel.tp", "weights.dtype", "spec.scheduler", "kv.dtype",
    "spec.head", "spec.draft_layers",
)


def _center(d: Any, default: Any) -> Any:
    """A starting value for a searched parameter without a preference: the engine default when the space
    allows it, else the middle of the range (geometric for log ranges) or the first choice."""
    if hasattr(d, "choices"):
        return default if default in d.choices else d.choices[0]
    lo, hi = d.low, d.high
    if default is not None and not isinstance(default, bool) and lo <= default <= hi:
        return default
    mid = math.sqrt(lo * hi) if getattr(d, "log", False) and lo > 0 else (lo + hi) / 2
    return type(lo)(round(mid)) if isinstance(lo, int) else mid


def _moves(d: Any, base: Any) -> list[Any]:
    """Values to try instead of `base`: other choices; a range's ends and the midpoints between them and
    `base` (log-spaced middles on a wide log range)."""
    if hasattr(d, "choices"):
        return [c for c in d.choices if c != base]
    lo, hi = d.low, d.high
    vals = [lo, hi, (lo + base) / 2, (base + hi) / 2]
    if getattr(d, "log", False) and lo > 0 and hi / lo > 16:
        vals = [lo, hi] + [lo * (hi / lo) ** f for f in (0.25, 0.5, 0.75)]
    if isinstance(lo, int):
        vals = [int(round(v)) for v in vals]
    return sorted({v for v in vals if v != base})


def start_point(space: SearchSpace) -> dict[str, Any]:
    """Trial 0: the rules' preferred values, the engine default or the range's centre elsewhere."""
    defaults = engine_defaults()
    return {k: space.warm_start.get(k, _center(d, defaults.get(k))) for k, d in space.distributions.items()}


def screen(study: Any, space: SearchSpace, objective: Callable[[Any], Any], budget: int,
           score: Callable[[Any], float], callbacks: list[Callable[[Any, Any], None]] | None = None,
           done: Callable[[], bool] | None = None) -> int:
    """Run trial 0 and the coordinate screen in this process, at most `budget` trials; returns how many ran.

    `score(frozen_trial)` ranks trials (higher is better; infeasible ones -inf); `done()` ends the screen
    early. Trial 0 is the study's enqueued start point when it has one (`open_study` enqueues it), else it
    is enqueued here."""
    from optuna.trial import TrialState

    def run(params: dict[str, Any] | None) -> float:
        if params is not None:
            study.enqueue_trial(params)
        study.optimize(objective, n_trials=1, callbacks=callbacks, catch=())
        last = study.trials[-1]
        return score(last) if last.state == TrialState.COMPLETE else -math.inf

    if budget <= 0:
        return 0
    waiting = any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False))
    best_p = start_point(space)
    best_v = run(None if waiting else best_p)
    seen, used, improved = {tuple(sorted(best_p.items()))}, 1, True
    while improved:  # passes until one improves nothing: knobs interact (a new TP moves the best batch size)
        improved = False
        for name in (n for n in SCREEN if n in space.distributions):
            for v in _moves(space.distributions[name], best_p[name]):
                p = {**best_p, name: v}
                if tuple(sorted(p.items())) in seen:
                    continue
                if used >= budget or (done is not None and done()):
                    return used
                seen.add(tuple(sorted(p.items())))
                x = run(p)
                used += 1
                if x > best_v:
                    best_p, best_v, improved = p, x, True
    return used
