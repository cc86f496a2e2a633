"""The simulator refitted on live trials: the fit explains measurements made with other efficiencies than the
prior's, is stored, and a later simulated study of the same hardware simulates with it."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from dspark_core.paths import ASSETS


def _spec():
    from kb.loader import load_rules
    from kb.match import match_profile
    from kb.sync import StoredRule
    from profiler.build import build_profile
    from tuner.study import StudySpec

    profile = build_profile(model=str(ASSETS / "target"), gpu="h100", workload="chat", measure=False)
    plan = match_profile([StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules()], profile)
    return StudySpec(profile=profile.model_dump(mode="json", exclude_none=True), plan=plan.model_dump(mode="json"),
                     mode="live", engine="dspark", engine_version="dspark-tune test")


def test_fit_recovers_a_machine_unlike_the_prior_and_later_studies_use_it(monkeypatch, tmp_path):
    from kb.db import open_db
    from tuner.design import start_point
    from tuner.live import calibration
    from tuner.objective import SimulateEvaluator
    from tuner.perf import Efficiency

    monkeypatch.setattr(calibration, "COMPUTE", np.array([0.05, 0.5]))
    monkeypatch.setattr(calibration, "OVERHEAD", np.array([2e-5, 2e-3]))
    monkeypatch.setattr(calibration, "PER_REQUEST", (0.0, 1e-3))
    spec = _spec()
    profile = spec.profile_model()
    space = spec.space()
    truth = replace(Efficiency.prior(profile.hw), compute=0.05, overhead_s=2e-3)  # a slow, host-bound machine
    real, prior = (SimulateEvaluator(profile, n_requests=32, efficiency=e, repeats=1) for e in (truth, None))
    trials = []
    for i, mr in enumerate((4, 16, 64, 256)):
        sampled = {**start_point(space), "batch.max_requests": mr}
        p = space.params_of(sampled)
        trials.append(SimpleNamespace(number=i, params=sampled, user_attrs={
            "metrics": real.evaluate(p).metrics, "predicted": prior.evaluate(p).metrics, "server_key": str(i)}))
    got = calibration.fit(spec, trials)
    assert got["efficiency"]["compute"] == 0.05 and got["efficiency"]["overhead_s"] == 2e-3
    assert got["spread"] < got["spread_before"] and abs(got["scale"] - 1) < 0.1
    assert got["at_grid_edge"] == ["overhead_s"]  # the truth sits on this grid's top: said, not hidden

    db = open_db(f"sqlite:///{tmp_path / 'kb.sqlite'}")
    assert calibration.store(db, "s", spec, trials)["efficiency"] is not None
    cal = calibration.lookup(db, profile.hw.name, profile.model.name)
    later = SimulateEvaluator(profile, repeats=1, calibration=cal)
    assert later.eff.compute == 0.05 and "calibration #1" in later.describe()
