"""A live study's finalists measured again: the export ranks them by the mean of their measurements, an SLO miss
counts as 0 tok/s, a configuration read back from an earlier trial's server is no finalist of its own."""

from __future__ import annotations

import optuna
from optuna.distributions import IntDistribution

from tuner.live.confirm import CONFIRM_ATTR, confirmed_throughput, exported_metrics, finalists
from tuner.study import best_trial

optuna.logging.set_verbosity(optuna.logging.WARNING)
D = {"spec.block_size": IntDistribution(1, 16)}


def _study(values: list[float], same: tuple[int, ...] = ()) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for i, v in enumerate(values):
        attrs = {"metrics": {"throughput": v}, "server_key": f"k{i if i not in same else 0}",
                 "same_server": i in same}
        study.add_trial(optuna.trial.create_trial(params={"spec.block_size": i + 1}, distributions=D, value=v,
                                                  user_attrs=attrs, constraints={"feasible": 0.0}))
    return study


class _Spec:
    mode = "live"
    objectives = ["throughput"]


def test_finalists_are_the_best_distinct_configurations():
    study = _study([100.0, 130.0, 120.0, 130.0], same=(3,))
    assert [t.number for t in finalists(study, 2)] == [1, 2]  # trial 3 read trial 0's server back: no finalist


def test_the_export_is_the_best_mean_not_the_luckiest_draw():
    study = _study([100.0, 130.0, 120.0])
    assert best_trial(study, _Spec()).number == 1  # before confirmation: the best single draw
    study.set_user_attr(CONFIRM_ATTR, {"1": [{"throughput": 90.0, "meets_slo": 1.0}],
                                       "2": [{"throughput": 118.0, "meets_slo": 1.0}],
                                       "0": [{"throughput": 200.0, "meets_slo": 0.0}]})
    t1, t2, t0 = (next(t for t in study.trials if t.number == n) for n in (1, 2, 0))
    assert confirmed_throughput(t1, study.user_attrs[CONFIRM_ATTR]) == 110.0
    assert confirmed_throughput(t0, study.user_attrs[CONFIRM_ATTR]) == 50.0  # its re-run missed an SLO: 0
    best = best_trial(study, _Spec())
    assert best.number == 2
    m = exported_metrics(study, _Spec(), best)
    assert m["throughput"] == 119.0 and m["throughput_trial"] == 120.0 and m["measurements"] == 2.0
