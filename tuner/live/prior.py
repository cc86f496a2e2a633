"""The simulator's ranking as a live study's prior: a short simulated search over the live space, whose best point
the live study runs right after the rules' preferred point (trial 0) and screens from if it measures better."""

from __future__ import annotations

from typing import Any

PRIOR_TRIALS = 24  # simulated trials (well under a second each); the live trials are what costs


def simulated_optimum(spec, trials: int = PRIOR_TRIALS) -> dict[str, Any] | None:  # noqa: ANN001 - StudySpec
    """The best simulated configuration of `spec`'s live space (its searched parameters), or None."""
    import optuna

    from tuner.objective import SimulateEvaluator
    from tuner.study import best_trial, make_sampler, objective_fn

    space = spec.space()
    if not space.distributions:
        return None
    sim_spec = spec.model_copy(update={"mode": "simulate", "n_requests": 48})
    try:
        evaluator = SimulateEvaluator(spec.profile_model(), n_requests=48, repeats=1, cost=spec.cost)
    except Exception:  # noqa: BLE001 - no prior (a GPU the simulator cannot price): the rules' point alone
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[("maximize" if o in ("throughput", "tau") else "minimize")
                                            for o in spec.objectives], sampler=make_sampler(spec.seed))
    from tuner.design import start_point

    study.enqueue_trial(start_point(space))
    study.optimize(objective_fn(space, evaluator, sim_spec), n_trials=trials, catch=())
    best = best_trial(study, sim_spec)
    if best is None:
        return None
    return {k: v for k, v in best.params.items() if k in space.distributions}
