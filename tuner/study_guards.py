"""Which trials a worker must not run: one past the study's target (two workers both saw room), an enqueued
configuration another worker already runs, and (live studies, servers side by side) a configuration another trial
measures or measured."""

from __future__ import annotations


def beyond_target(trial, target: int) -> bool:
    """Whether `trial` came after the study already had `target` completed, running or queued trials: two workers
    that both saw room for one more trial keep the one the database numbered first. A queued (enqueued, still
    WAITING) trial counts: it keeps its lower number when a worker pops it later, so leaving it out let a trial
    numbered after it run too, one over the target."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
    ahead = [t for t in trial.study.get_trials(deepcopy=False, states=states) if t.number < trial.number]
    return len(ahead) >= target


def enqueued_twice(trial, names: set[str] | None = None) -> int | None:
    """The earlier trial holding the same enqueued configuration as `trial`, if one runs or ran: two screens that
    both found a move missing both enqueue it (the check and the insert are two transactions); the later copy is
    dropped when it is popped instead of being run again. `names`: the searched parameters; a partial enqueue
    (`hot_siblings`: the sampler sets the rest) is no copy of anything."""
    from optuna.trial import TrialState

    trials = trial.study.get_trials(deepcopy=False)
    me = next((t for t in trials if t.number == trial.number), None)
    fixed = me.system_attrs.get("fixed_params") if me is not None else None
    if not fixed or (names is not None and set(fixed) != set(names)):
        return None
    for t in trials:
        if t.number < trial.number and t.state in (TrialState.COMPLETE, TrialState.RUNNING) and \
                (t.system_attrs.get("fixed_params") or dict(t.params)) == fixed:
            return t.number
    return None


DUPLICATES_PER_TRIAL = 3  # pruned repeats a live study tolerates per target trial before it measures a repeat


def measured_twice(trial, target: int | None) -> int | None:
    """The earlier or running trial whose parameters equal `trial`'s, while the study has not yet pruned
    DUPLICATES_PER_TRIAL x `target` such repeats (a small space the sampler keeps revisiting then measures one
    again, instead of sampling forever)."""
    from optuna.trial import TrialState

    trials = trial.study.get_trials(deepcopy=False)
    repeats = sum(1 for t in trials if t.state == TrialState.PRUNED and "duplicate_of" in t.user_attrs)
    if repeats >= DUPLICATES_PER_TRIAL * max(target or 1, 1):
        return None
    mine = dict(trial.params)
    for t in trials:
        if t.number != trial.number and t.state in (TrialState.COMPLETE, TrialState.RUNNING) and \
                dict(t.params) == mine:
            return t.number
    return None
