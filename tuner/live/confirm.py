"""The finalists of a live study measured again before export: the winner's curse, removed.

A live trial is one measurement, and on shared hardware one configuration's measurements spread by +-10-20% from
one server start to the next. The best of a dozen trials is then mostly the luckiest draw, and its launch script,
rerun, falls back to the configuration's true speed (a replay at 0.7-0.8x the trial was measured here). So after
the search the `k` best distinct configurations each run once more on a fresh server, and the export ranks them by
the mean of all their measurements (a measurement that misses an SLO counts as 0 tok/s: a configuration that misses
half the time is no deployment). The re-measurements are kept in the study (user attribute `confirmations`), so a
resumed study confirms only what is new, and the report shows every measurement.
"""

from __future__ import annotations

import statistics
from typing import Any

CONFIRM_ATTR = "confirmations"  # study user attribute: {trial number: [re-measured metrics, ...]}


def finalists(study, k: int) -> list[Any]:  # noqa: ANN001 - optuna.Study -> list[FrozenTrial]
    """The `k` best SLO-feasible trials by their own measurement, one per configuration (a trial read back from an
    earlier one's server measured nothing of its own)."""
    from tuner.study import feasible_trials

    seen: set[str] = set()
    out = []
    for t in sorted(feasible_trials(study), key=lambda t: (-t.values[0], t.number)):
        key = t.user_attrs.get("server_key") or str(t.number)
        if t.user_attrs.get("same_server") or key in seen:
            continue
        seen.add(key)
        out.append(t)
    return out[:k]


def confirm(study, spec, k: int, evaluator=None, on_step=None) -> dict[str, list[dict[str, float]]]:  # noqa: ANN001
    """Measure each of the `k` finalists not yet confirmed once more, each on a server of its own; returns (and
    stores) the study's confirmations. `on_step(done, n)` reports progress after each."""
    from tuner.live.evaluator import LiveEvaluator
    from tuner.study import slo_constraints

    done: dict[str, list[dict[str, float]]] = dict(study.user_attrs.get(CONFIRM_ATTR) or {})
    todo = [t for t in finalists(study, k) if str(t.number) not in done]
    if not todo:
        return done
    space = spec.space()
    ev = evaluator or LiveEvaluator(spec)
    ev.alone = True  # with --devices: no other server on this machine while a finalist is measured again
    try:
        for i, t in enumerate(todo):
            r = ev.remeasure(space.params_of(dict(t.params)), seed=spec.seed + 1 + i)  # as the exported script starts
            met = r.feasible and all(v <= 0 for v in slo_constraints(r, spec.slo_tpot_ms, spec.slo_ttft_ms).values())
            run = {**r.metrics, "throughput": r.metrics.get("throughput", 0.0), "meets_slo": float(met)}
            done[str(t.number)] = [*done.get(str(t.number), []), run]
            study.set_user_attr(CONFIRM_ATTR, done)  # kept as it goes: an interrupted confirmation resumes
            if on_step:
                on_step(i + 1, len(todo))
    finally:
        if evaluator is None:
            ev.close()
    return done


def confirmed_throughput(trial, confirmations: dict[str, list[dict[str, float]]]) -> float | None:  # noqa: ANN001
    """The mean throughput over a trial's own measurement and its re-measurements (an SLO miss counts 0), None when
    it was not re-measured."""
    again = confirmations.get(str(trial.number))
    if not again:
        return None
    runs = [float(trial.values[0])] + [m["throughput"] if m.get("meets_slo") else 0.0 for m in again]
    return statistics.mean(runs)


def exported_metrics(study, spec, trial) -> dict[str, float]:  # noqa: ANN001 - optuna objects, StudySpec
    """The exported trial's figures: a live finalist's throughput is the mean of its measurements (the trial's own
    kept as `throughput_trial`)."""
    metrics = dict(trial.user_attrs.get("metrics", {}))
    again = study.user_attrs.get(CONFIRM_ATTR) or {}
    mean = confirmed_throughput(trial, again) if spec.mode == "live" else None
    if mean is not None:
        metrics.update(throughput=mean, throughput_trial=float(trial.values[0]),
                       measurements=1.0 + len(again[str(trial.number)]))
    return metrics
