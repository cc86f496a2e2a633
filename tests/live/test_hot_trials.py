"""Restart-free knobs within one server life: a live trial that differs from the running server only in settings
the engine takes hot (params.yaml `hot`) reconfigures it instead of restarting it, and after the screen each newly
started server gets trials that vary only those settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.live.test_engines import _params, _plan, _profile
from tests.live.test_tune_live import _servers_running
from tuner.live.engines import DsparkEngine, VllmEngine
from tuner.live.order import hot_siblings
from tuner.study import StudySpec, enqueued_twice

TINY = Path(__file__).resolve().parents[2] / "dspark_core" / "assets" / "target"


@pytest.fixture
def spec(tmp_path, monkeypatch) -> StudySpec:
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path / "state"))
    p = _profile("cpu")
    p.workload.concurrency = 2
    return StudySpec(profile=p.model_dump(mode="json", exclude_none=True), plan=_plan(p).model_dump(mode="json"),
                     mode="live", engine="dspark", live_concurrency=2, live_requests=4, live_max_tokens=8)


def test_only_the_verify_length_settings_are_hot_and_only_for_our_engine():
    profile = _profile("cpu")
    p = _params(profile, **{"spec.scheduler": "prefix", "spec.max_verify_tokens": 4})
    assert DsparkEngine(profile, TINY).hot_names(p) >= {"spec.scheduler", "spec.max_verify_tokens"}
    assert not DsparkEngine(profile, TINY).hot_names(p) & {"spec.block_size", "weights.dtype", "batch.max_requests"}
    assert VllmEngine(profile, TINY).hot_names(p) == set()


def test_a_hot_change_reconfigures_the_running_server_and_a_cold_one_restarts_it(spec, tmp_path):
    from tuner.live.evaluator import LiveEvaluator

    ev = LiveEvaluator(spec)
    base = {**_params(spec.profile_model()), "spec.enabled": True, "spec.block_size": 4, "weights.dtype": "auto"}
    try:
        a = ev.evaluate({**base, "spec.scheduler": "verify_all"})
        b = ev.evaluate({**base, "spec.scheduler": "prefix"})
        c = ev.evaluate({**base, "spec.scheduler": "threshold"})
        again = ev.evaluate({**base, "spec.scheduler": "prefix"})  # measured in this run: not run again
        d = ev.evaluate({**base, "spec.scheduler": "prefix", "spec.block_size": 3})
        assert a.feasible and b.feasible and c.feasible and d.feasible, (a.why, b.why, c.why, d.why)
        assert not a.extra["reused_server"] and "reconfigured" not in a.extra
        assert b.extra["reconfigured"] and c.extra["reconfigured"] and b.extra["server_starts"] == 1
        assert again.extra["same_server"]
        assert not d.extra["reused_server"] and d.extra["server_starts"] == 2  # a new block length: a restart
        assert b.metrics["throughput"] > 0 and b.extra["server_key"] != a.extra["server_key"]
        assert ev.reconfigurations == 2
    finally:
        ev.close()
    assert not _servers_running(str(tmp_path / "state"))
    assert not list((tmp_path / "state" / "servers").glob("*.json"))


def test_each_new_server_gets_trials_that_vary_only_its_hot_settings(spec):
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from tuner.live.evaluator import LiveEvaluator

    study = optuna.create_study(direction="maximize")
    dists = {"spec.block_size": IntDistribution(3, 11), "spec.scheduler":
             CategoricalDistribution(["verify_all", "prefix"]), "weights.dtype": CategoricalDistribution(["auto"])}
    params = {"spec.block_size": 5, "spec.scheduler": "prefix", "weights.dtype": "auto"}
    space = type("S", (), {"distributions": dists})()
    fresh = optuna.trial.create_trial(params=params, distributions=dists, value=1.0,
                                      user_attrs={"reused_server": False})
    reused = optuna.trial.create_trial(params=params, distributions=dists, value=1.0,
                                       user_attrs={"reused_server": True})
    ev = LiveEvaluator.__new__(LiveEvaluator)
    ev.engine = DsparkEngine(spec.profile_model(), TINY)
    assert hot_siblings(study, space, ev, reused, 2) == 0  # its server was already there: siblings exist
    assert hot_siblings(study, space, ev, fresh, 2) == 2
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"spec.block_size": 5, "weights.dtype": "auto"}] * 2
    trial = study.ask()  # the sampler sets the hot setting; a partial enqueue is no copy of its twin
    assert trial.params == {} and enqueued_twice(trial, set(dists)) is None
    assert trial.suggest_int("spec.block_size", 3, 11) == 5
    off = optuna.trial.create_trial(params={**params, "spec.enabled": False}, value=1.0,
                                    distributions={**dists, "spec.enabled": CategoricalDistribution([True, False])},
                                    user_attrs={"reused_server": False})
    assert hot_siblings(study, space, ev, off, 2) == 0  # speculation off: its spec settings name one server
