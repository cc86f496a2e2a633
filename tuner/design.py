"""The study's first trials: the rules' preferred point, then a coordinate screen of the main knobs.

TPE models nothing until it has seen trials, and its random start-up trials spend a small budget on
corners the rules already advise against. The rules' preferred values are the best single guess, so the
study starts there (trial 0, every searched parameter set) and then screens the main knobs one at a time
from the best point so far (every other choice of a categorical knob, the ends and log-spaced middles of
a range), keeping a move when it scores better; when a pass improves nothing, range knobs take shorter
steps (a pattern search); a move that lost clearly (missed an SLO the point met, or scored over 10% below
it) is not retried on later passes. Trials that miss an SLO are ranked by how far they miss, so a start point that
misses can walk towards one that meets them. These trials also teach TPE which knobs matter before it
samples on its own. Only the knobs DESIGN.md section 3 puts first are screened; the rest stay at the
preferred point until TPE moves them, except, in a live study, the knobs a running server takes without a restart:
a few of their moves run on each server the screen starts for a new best point. Measured effect:
`python benchmarks/bench_search.py`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tuner.space import SearchSpace, engine_defaults
from tuner.trial_run import fail_dead, run_trial

SCREEN = (  # screened knobs, in order: speculation on or off where an engine searches it (a live peer engine), then
    # capacity (running requests and TP decide whether the SLOs can be met at all, so the block length is then tuned
    # at a load that meets them; a MoE server's attention DP and EP with its TP), then block length, which moves
    # throughput most, and the learned per-round block within it (searched only where a policy exists), the
    # speculative method (a peer's, or the bundled engine's with plain among them) and how far suffix decoding
    # drafts, then dtypes and the drafter
    "spec.enabled", "batch.max_requests", "parallel.tp", "parallel.dp_attention", "parallel.ep", "spec.block_size",
    "spec.gamma_policy", "spec.method", "drafter.suffix_spec_factor", "weights.dtype", "spec.scheduler", "kv.dtype",
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
    """Coarse values to try instead of `base`: other choices; a range's ends and the midpoints between them
    and `base` (log-spaced middles on a wide log range)."""
    if hasattr(d, "choices"):
        return [c for c in d.choices if c != base]
    lo, hi = d.low, d.high
    vals = [lo, hi, (lo + base) / 2, (base + hi) / 2]
    if _wide_log(d):
        vals = [lo, hi] + [lo * (hi / lo) ** f for f in (0.25, 0.5, 0.75)]
    return _distinct(d, vals, base)


def _wide_log(d: Any) -> bool:
    """A log range spanning more than 16x: screened at log-spaced points rather than linear midpoints."""
    return bool(getattr(d, "log", False)) and d.low > 0 and d.high / d.low > 16


def _distinct(d: Any, vals: list[Any], base: Any) -> list[Any]:
    """`vals` rounded onto an integer range, without duplicates or `base`, sorted."""
    if isinstance(d.low, int):
        vals = [int(round(v)) for v in vals]
    return sorted({v for v in vals if v != base})


def _refine(d: Any, base: Any, level: int) -> list[Any]:
    """Finer moves of a range knob once the coarse ones stall: the step towards the nearest coarse move on
    each side of `base`, halved `level` times (geometrically on a log range). Categorical knobs: none."""
    if hasattr(d, "choices") or level <= 0:
        return []
    coarse = _moves(d, base)
    sides = [max((m for m in coarse if m < base), default=None), min((m for m in coarse if m > base), default=None)]
    vals = []
    for v in (x for x in sides if x is not None):
        for _ in range(level):
            v = math.sqrt(v * base) if getattr(d, "log", False) and d.low > 0 else (v + base) / 2
        vals.append(v)
    return _distinct(d, vals, base)


def _ends_first(vals: list[Any]) -> list[Any]:
    """Sorted moves from the outside in (1, 8, 3, 5): a few of them still span the range."""
    out, lo, hi = [], 0, len(vals) - 1
    while lo <= hi:
        out.append(vals[lo])
        if hi != lo:
            out.append(vals[hi])
        lo, hi = lo + 1, hi - 1
    return out


FAR_WORSE = 0.10  # a move scoring this much below the point it left is not retried on later passes


def far_worse(x: Any, base: Any, margin: float = FAR_WORSE) -> bool:
    """Whether score `x` lost clearly to `base`: failed, in a lower tier of a (tier, value) score (missed an SLO
    the base met), or more than `margin` below it. Near losses are not: knobs interact, and a move that lost by
    a few percent from one point can win from the next."""
    if base is None:
        return False
    if x is None:
        return True
    if isinstance(x, tuple):
        if x[0] != base[0]:
            return x[0] < base[0]
        x, base = x[-1], base[-1]
    return x < base - margin * abs(base)


def start_point(space: SearchSpace) -> dict[str, Any]:
    """Trial 0: the rules' preferred values, the engine default or the range's centre elsewhere. A preferred value
    the space no longer holds (a live engine's narrowed range: the closed loop caps running requests) is brought
    into it, so no trial runs outside its own distribution."""
    defaults = engine_defaults()
    return {k: inside(d, space.warm_start[k], _center(d, None)) if k in space.warm_start
            else _center(d, defaults.get(k)) for k, d in space.distributions.items()}


def inside(d: Any, v: Any, otherwise: Any) -> Any:
    """`v` if distribution `d` holds it, a range's nearest end when `v` is a number beyond it, else `otherwise`."""
    if hasattr(d, "choices"):
        return v if v in d.choices else otherwise
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return otherwise
    return type(d.low)(min(max(v, d.low), d.high))


def _params_of(t: Any) -> dict[str, Any]:
    """A trial's parameters, also for a WAITING one (enqueued: its values wait in `fixed_params`)."""
    return dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})


_STATE_ORDER = ("COMPLETE", "RUNNING", "WAITING", "FAIL")  # which copy of a configuration speaks for it


def _copy_of(study: Any, params: dict[str, Any]) -> Any:
    """The study's trial of exactly `params` (a finished one first), or None."""
    same = [t for t in study.get_trials(deepcopy=False) if t.state.name in _STATE_ORDER and _params_of(t) == params]
    return min(same, key=lambda t: (_STATE_ORDER.index(t.state.name), t.number), default=None)


def screen(study: Any, space: SearchSpace, objective: Callable[[Any], Any], budget: int,
           score: Callable[[Any], Any], callbacks: list[Callable[[Any, Any], None]] | None = None,
           done: Callable[[], bool] | None = None, levels: int = 2, poll_s: float = 0.5,
           starts: list[dict[str, Any]] | None = None, hot: tuple[str, ...] = (), hot_moves: int = 0,
           idle: Callable[[], None] | None = None) -> int:
    """Run trial 0 and the coordinate screen, at most `budget` new trials; returns how many it ran.

    `score(frozen_trial)` ranks completed trials (any totally ordered value, higher is better, e.g.
    `tuner.study.trial_rank`, which also orders SLO misses so the screen can walk out of an infeasible
    start); `done()` ends the screen early. Trial 0 is the study's enqueued start point when it has one
    (`open_study` enqueues it), else it is enqueued here. Passes repeat while they improve; when one
    stalls, range knobs take steps half as long, `levels` times (a pattern search). `starts`: more start points
    (a live study's simulated optimum), run right after trial 0; the screen walks from the best of them. `hot`:
    knobs a running server takes without a restart (a live study); right after trial 0 and after each move that
    improves, at most `hot_moves` of their moves run from the new best, on the server it just started. `idle()` runs
    while the screen waits on a move another process runs (a live study: its kept server stops when a measurement
    elsewhere on the machine waits to run alone, which the move it waits on may be queued behind).

    The screen is a deterministic walk over the scores it sees, so it resumes where it stopped: a move the
    study already holds is read back, not run again (an interrupted study ends where an uninterrupted one
    does), and a move another process is running is waited for (two `tune` processes on one study share the
    screen instead of running it twice)."""

    def evaluate(params: dict[str, Any]) -> Any:
        """Score of the configuration `params`, running it here unless another process already is."""
        if _copy_of(study, params) is None:
            study.enqueue_trial(params)
        while True:
            t = _copy_of(study, params)
            if t is None or t.state.name == "FAIL":
                return None
            if t.state.name == "COMPLETE":
                return score(t)
            if t.state.name == "WAITING":
                run_trial(study, objective, callbacks)  # pops the oldest waiting (tuner/trial_run.py)
            else:  # running in another worker: wait, failing it if that worker died (identity, heartbeat)
                if idle is not None:
                    idle()
                time.sleep(poll_s)
                fail_dead(study)

    def known(params: dict[str, Any]) -> tuple[bool, Any]:
        t = _copy_of(study, params)
        return (True, score(t)) if t is not None and t.state.name == "COMPLETE" else (False, None)

    if budget <= 0:
        return 0
    best_p = start_point(space)
    replayed, best_v = known(best_p)
    used = 0
    if not replayed:
        best_v, used = evaluate(best_p), 1
    seen, level = {tuple(sorted(best_p.items()))}, 0

    def visit(p: dict[str, Any]) -> tuple[bool, Any]:
        """(out of budget, score) of one configuration: read back when the study holds it, else run it."""
        nonlocal used
        replayed, x = known(p)
        if not replayed:
            if used >= budget or (done is not None and done()):
                return True, None
            x, used = evaluate(p), used + 1
        seen.add(tuple(sorted(p.items())))
        return False, x

    def hot_pass() -> bool:
        """Up to `hot_moves` hot moves from the best point (on its running server); True when out of budget."""
        nonlocal best_p, best_v
        tried = 0
        for name in (n for n in hot if n in space.distributions):
            for v in _ends_first(_moves(space.distributions[name], best_p[name])):
                p = {**best_p, name: v}
                if tried >= hot_moves or tuple(sorted(p.items())) in seen:
                    continue
                stop, x = visit(p)
                tried += 1
                if stop:
                    return True
                if x is not None and (best_v is None or x > best_v):
                    best_p, best_v = p, x
        return False

    if hot_pass():
        return used
    for extra in starts or []:
        p = {**best_p, **{k: v for k, v in extra.items() if k in space.distributions}}
        if tuple(sorted(p.items())) in seen:
            continue
        stop, x = visit(p)
        if stop:
            return used
        if x is not None and (best_v is None or x > best_v):
            best_p, best_v = p, x
    lost: set[tuple[str, Any]] = set()  # (knob, value) moves that lost clearly (`far_worse`): not retried
    while level <= levels:
        improved = False  # knobs interact (a new TP moves the best batch size): repeat passes while they improve
        for name in (n for n in SCREEN if n in space.distributions):
            if name in space.reads and best_p.get("spec.method") not in space.reads[name]:
                continue  # the point's method does not read this knob: a move would measure the point again
            d = space.distributions[name]
            for v in (_moves(d, best_p[name]) if level == 0 else _refine(d, best_p[name], level)):
                p = {**best_p, name: v}
                if tuple(sorted(p.items())) in seen or (name, v) in lost:
                    continue
                stop, x = visit(p)
                if stop:
                    return used
                if far_worse(x, best_v):
                    lost.add((name, v))
                if x is not None and (best_v is None or x > best_v):
                    best_p, best_v, improved = p, x, True
                    if name not in hot and hot_pass():
                        return used
        if not improved:
            level += 1
    return used
