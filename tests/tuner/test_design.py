"""The study's start: the rules' preferred point, then the coordinate screen of the main knobs."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from tuner.design import _moves, _refine, far_worse, screen, start_point
from tuner.space import SearchSpace
from tuner.study import miss, trial_rank

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


def test_refine_halves_the_step_towards_the_nearest_coarse_moves() -> None:
    log = IntDistribution(4, 1024, log=True)
    assert _refine(log, 64, 0) == []  # level 0 is the coarse screen
    assert _refine(log, 64, 1) == [32, 128]  # geometric midpoints towards 16 and 256
    assert _refine(log, 64, 2) == [45, 91]
    assert _refine(IntDistribution(5, 12), 10, 1) == [9]  # towards 8 and 11; 10.5 rounds back onto the base
    assert _refine(CategoricalDistribution(["a", "b"]), "a", 1) == []


def test_screen_walks_out_of_an_slo_infeasible_start() -> None:
    # a point with block > 6 or batch > 64 misses the SLO, by how much it exceeds them; the best point that meets
    # it is block 6, batch 64. Without ranking the misses, every move from the infeasible start (block 7, batch
    # 1024) scores the same and the screen never leaves it.
    space = _space()

    def objective(trial) -> float:
        p = space.suggest(trial)
        over = max(0, p["spec.block_size"] - 6) / 6 + max(0.0, p["batch.max_requests"] / 64 - 1)
        trial.set_constraint("slo", over)
        return p["spec.block_size"] + p["batch.max_requests"] / 16

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({**start_point(space), "batch.max_requests": 1024})
    screen(study, space, objective, budget=60, score=trial_rank)
    assert miss(study.trials[0]) > 0
    best = max(study.trials, key=trial_rank)
    assert miss(best) == 0 and best.params["spec.block_size"] == 6 and best.params["batch.max_requests"] == 64


def test_far_worse_separates_clear_losses_from_near_ones() -> None:
    assert far_worse(None, (1, 100.0)) and not far_worse((1, 50.0), None)  # failed move; no base yet
    assert far_worse((0, -0.1), (1, 100.0))  # misses an SLO the base meets
    assert not far_worse((0, -0.1), (0, -0.5))  # both miss: walking out of an infeasible start
    assert far_worse((1, 89.0), (1, 100.0)) and not far_worse((1, 91.0), (1, 100.0))
    assert far_worse(-120.0, -100.0) and not far_worse(-105.0, -100.0)  # minimised objectives rank by -value


def test_screen_does_not_retry_a_move_that_lost_clearly() -> None:
    space = _space()
    calls: list[dict] = []

    def objective(trial) -> float:  # block 2 loses by 50% wherever it is tried; the scheduler, screened after
        p = space.suggest(trial)  # the block, then moves the base, so the next pass meets block 2 at a new point
        calls.append(p)
        if p["spec.block_size"] == 2:
            return 50.0
        return 100.0 + p["spec.block_size"] + p["batch.max_requests"] / 1e3 + (p["spec.scheduler"] == "prefix")

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    screen(study, space, objective, budget=200, score=lambda t: t.value)
    assert sum(p["spec.block_size"] == 2 for p in calls) == 1  # tried in the first pass only
    assert study.best_trial.params["spec.block_size"] == 12 and study.best_trial.params["spec.scheduler"] == "prefix"


def test_hot_knobs_move_right_after_each_new_best_on_its_server() -> None:
    """A live study's restart-free knob (here timeout_ms stands in for one) is screened from trial 0 and from each
    new best point, right after it, `hot_moves` values at a time, ends first; it is otherwise left to TPE."""
    space = _space()

    def value(p: dict) -> float:
        return -abs(p["spec.block_size"] - 12) + p["batch.timeout_ms"] / 100

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    screen(study, space, lambda t: value(space.suggest(t)), budget=14, score=lambda t: t.value,
           hot=("batch.timeout_ms",), hot_moves=2)
    p = [dict(t.params) for t in study.trials]
    assert p[0] == start_point(space)
    assert [x["batch.timeout_ms"] for x in p[1:3]] == [5, 10]  # its moves from 0, outside in
    assert all(x["spec.block_size"] == 7 for x in p[1:3])  # trial 0's server: only the hot knob moved
    # the first block move that improves (block 10 from 7) is followed by hot moves from it, on its server
    first = next(i for i, x in enumerate(p) if x["spec.block_size"] == 10)
    assert [x["spec.block_size"] for x in p[first:first + 3]] == [10, 10, 10]
    assert [x["batch.timeout_ms"] for x in p[first:first + 3]] == [10, 0, 5]  # from the best (10), outside in


def test_screen_does_not_move_a_knob_the_points_method_does_not_read() -> None:
    """An n-gram point run again with another suffix setting measures nothing new (`SearchSpace.reads`): the knob is
    moved only from a point whose method reads it."""
    space = SearchSpace(distributions={"spec.method": CategoricalDistribution(["ngram", "suffix"]),
                                       "drafter.suffix_spec_factor": CategoricalDistribution([1.0, 8.0])},
                        fixed={}, defaults={}, warm_start={"spec.method": "ngram", "drafter.suffix_spec_factor": 1.0},
                        reads={"drafter.suffix_spec_factor": ("suffix",)})

    def ran(ngram: float) -> list[tuple[str, float]]:
        """The screen's trials where n-gram scores `ngram` and suffix its setting / 4 (0.25 or 2)."""
        def value(p: dict) -> float:
            return ngram if p["spec.method"] == "ngram" else p["drafter.suffix_spec_factor"] / 4

        study = optuna.create_study(direction="maximize")
        screen(study, space, lambda t: value(space.suggest(t)), budget=20, score=lambda t: t.value)
        return [(t.params["spec.method"], t.params["drafter.suffix_spec_factor"]) for t in study.trials]

    assert ran(ngram=1.0) == [("ngram", 1.0), ("suffix", 1.0)]  # never ("ngram", 8.0)
    space.warm_start["spec.method"] = "suffix"
    assert ran(ngram=0.1) == [("suffix", 1.0), ("ngram", 1.0), ("suffix", 8.0)]  # from suffix, the best, it moves
