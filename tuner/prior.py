"""The simulator's ranking as a live study's prior: a short simulated search over the live space (the same coordinate
screen a study starts with, then TPE), whose best point the live study runs right after the rules' preferred point
(trial 0) and screens from if it measures better."""

from __future__ import annotations

from typing import Any

PRIOR_TRIALS = 32  # simulated trials (well under a second each); the live trials are what costs


def simulated_optimum(spec, trials: int = PRIOR_TRIALS) -> dict[str, Any] | None:  # noqa: ANN001 - StudySpec
    """The best simulated configuration of `spec`'s live space (its searched parameters), or None."""
    import optuna

    from tuner.objective import SimulateEvaluator
    from tuner.study import best_trial, make_sampler, maximizes, objective_fn, trial_rank

    space = spec.space()
    if not space.distributions:
        return None
    sim_spec = spec.model_copy(update={"mode": "simulate", "n_requests": 48})
    try:
        evaluator = SimulateEvaluator(spec.profile_model(), n_requests=48, repeats=2, cost=spec.cost,
                                      calibration=spec.calibration)
    except Exception:  # noqa: BLE001 - no prior (a GPU the simulator cannot price): the rules' point alone
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[("maximize" if o in ("throughput", "tau") else "minimize")
                                            for o in spec.objectives], sampler=make_sampler(spec.seed))
    from tuner.design import screen

    objective = objective_fn(space, evaluator, sim_spec)
    used = screen(study, space, objective, trials, lambda t: trial_rank(t, maximizes(sim_spec)))
    if trials > used:
        study.optimize(objective, n_trials=trials - used, catch=())
    best = best_trial(study, sim_spec)
    if best is None:
        return None
    return {k: v for k, v in best.params.items() if k in space.distributions}
