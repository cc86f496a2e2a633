"""The study's start: the rules' preferred point, then the coordinate screen of the main knobs."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from tuner.design import _moves, screen, start_point
from tuner.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _space() -> SearchSpace:
    return SearchSpace(
        distributions={"spec.block_size": IntDistribution(2, 12),
                       "batch.max_requests": IntDistribution(4, 1024, log=True),
                       "spec.scheduler": CategoricalDistribution(["prefix", "async_topk"]),
                       "batch.timeout_ms": IntDistribution(0, 10)},
        fixed={}, defaults={}, warm_start={"spec.block_size": 7, "spec.scheduler": "async_topk"})


def test_start_point_takes_preferences_then_defaults_then_centres() -> None:
    p = start_point(_space())
    assert p["spec.block_size"] == 7 and p["spec.scheduler"] == "async_topk"  # the rules' preferences
    assert p["batch.max_requests"] == 8  # engine default, inside the range
    assert p["batch.timeout_ms"] == 0  # engine default 0.0 is inside [0, 10]
    assert _moves(IntDistribution(4, 1024, log=True), 8) == [4, 16, 64, 256, 1024]  # ends + log-spaced middles
    assert _moves(IntDistribution(2, 12), 7) == [2, 4, 10, 12]  # ends + midpoints towards them


def test_screen_climbs_one_knob_at_a_time_and_keeps_improvements() -> None:
    space = _space()
    # a separable landscape: best at block 12, 64 requests, prefix; timeout_ms is not screened
    def value(p: dict) -> float:
        reward = p["spec.scheduler"] == "prefix"
        return -abs(p["spec.block_size"] - 12) - abs(p["batch.max_requests"] - 64) / 10 + reward

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(start_point(space))
    used = screen(study, space, lambda t: value(space.suggest(t)), budget=200, score=lambda t: t.value)
    assert used == len(study.trials) < 200  # stops after a pass that improves nothing
    keys = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(keys)) == len(keys)  # no configuration evaluated twice
    assert study.trials[0].params == start_point(space)
    assert study.best_trial.params["spec.block_size"] == 12 and study.best_trial.params["batch.max_requests"] == 64
    assert study.best_trial.params["spec.scheduler"] == "prefix"
    assert all(t.params["batch.timeout_ms"] == 0 for t in study.trials)  # left to TPE


def test_screen_respects_budget_and_done() -> None:
    space = _space()
    study = optuna.create_study(direction="maximize")
    assert screen(study, space, lambda t: float(space.suggest(t)["spec.block_size"]), 3, lambda t: t.value) == 3
    assert len(study.trials) == 3 and study.trials[0].params == start_point(space)  # enqueued here when absent
    other = optuna.create_study(direction="maximize")
    assert screen(other, space, lambda t: 1.0, 50, lambda t: t.value, done=lambda: True) == 1
    assert screen(other, space, lambda t: 1.0, 0, lambda t: t.value) == 0
