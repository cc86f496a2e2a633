"""Simulator fidelity, small: calibrated on this CPU, the simulator ranks clearly different configs right.

Checks the offline replay, and replays the benchmark's recorded calibration and measurements
(benchmarks/results/fidelity.json) through today's simulator: it must still rank them right.
"""

from __future__ import annotations

import importlib.util
import sys
from itertools import combinations
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARGIN = 1.5  # measured ratio above which a pair must be ordered right (the benchmark's own noise is ~10-15%)


@pytest.fixture(scope="module")
def fid():
    spec = importlib.util.spec_from_file_location("bench_fidelity", ROOT / "benchmarks" / "bench_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_fidelity"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench(fid):
    return fid.Bench(n_prompts=4, max_new=16)


def test_offline_replay_is_exact_workload(bench):
    from tuner.acceptance import AcceptanceModel
    from tuner.perf import Efficiency, PerfModel
    from tuner.simulate import simulate

    perf = PerfModel(bench.shape, bench.hw, Efficiency(round_s=1e-3), weights_dtype="fp32", kv_dtype="fp32")
    lengths = [(30, 5), (50, 9)]
    res = simulate(bench.params(batch__max_requests=1), bench.profile, perf,
                   AcceptanceModel(0.5, 1.0, 3.0, "test"), requests=lengths, bundled=True)
    assert res.requests == 2
    # one request at a time: prefill + (output - 1) rounds each, all charged the host overhead
    assert res.extra["host_rounds"] == 2 + 4 + 8
    assert res.throughput == pytest.approx(14 / res.extra["makespan_s"])


@pytest.mark.parametrize("record", ["fidelity.json", "fidelity_smollm2-135m.json"])  # tiny target; the real one
def test_simulator_keeps_the_recorded_ranking(fid, record: str):
    """Deterministic regression: today's simulator, with the calibration the benchmark recorded on this CPU,
    still ranks the benchmark's measured configurations (Spearman >= 0.9, MAPE <= 15 %, pairs 1.5x apart in order).

    Timing-free on purpose: live measurements on shared cores swing by tens of percent within minutes.
    Refresh the record with `python benchmarks/bench_fidelity.py`.
    """
    import json
    import types

    from profiler.schema import Profile
    from tuner.perf import Hardware, ModelShape

    data = json.loads((ROOT / "benchmarks" / "results" / record).read_text())
    profile = Profile.model_validate(data["profile"])
    b = types.SimpleNamespace(profile=profile, shape=ModelShape.from_profile(profile),
                              hw=Hardware.from_profile(profile), heads=data["heads"],
                              dtype=data["summary"].get("dtype", "fp32"))
    b.params = types.MethodType(fid.Bench.params, b)
    measured = {r["config"]: r["measured"] for r in data["rows"]}
    cfgs = [c for c in fid.eval_configs(b) if fid.label(c) in measured]
    assert len(cfgs) >= 20
    lengths = [tuple(x) for x in data["lengths"]]
    meas = [measured[fid.label(c)] for c in cfgs]
    pred = [fid.predict(b, c, data["calibration"], lengths, seeds=2)["throughput"] for c in cfgs]
    assert fid.spearman(pred, meas) >= 0.9, list(zip(map(fid.label, cfgs), meas, pred, strict=True))
    assert fid.mape(pred, meas) <= 0.15
    clear = [(i, j) for i, j in combinations(range(len(cfgs)), 2)
             if max(meas[i], meas[j]) / min(meas[i], meas[j]) > MARGIN]
    wrong = [(fid.label(cfgs[i]), fid.label(cfgs[j])) for i, j in clear
             if (meas[i] > meas[j]) != (pred[i] > pred[j])]
    assert clear and not wrong, f"misranked {wrong}"
