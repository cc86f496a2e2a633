"""Simulator fidelity, small: calibrated on this CPU, the simulator ranks clearly different configs right.

A fast version of benchmarks/bench_fidelity.py: calibrate on instrumented runs of the tiny target
(calibration prompts and configurations of their own), then measure a handful of evaluation
configurations whose throughputs differ clearly and check that every pair the measurement separates
by more than 25% is ordered the same way by the simulator.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from itertools import combinations
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARGIN = 1.25  # measured ratio above which a pair counts as clearly different (shared, noisy cores)


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
                   AcceptanceModel(0.5, 1.0, 3.0, "test"), requests=lengths, padded=True)
    assert res.requests == 2
    # one request at a time: prefill + (output - 1) rounds each, all charged the host overhead
    assert res.extra["host_rounds"] == 2 + 4 + 8
    assert res.throughput == pytest.approx(14 / res.extra["makespan_s"])


def test_simulator_ranks_clearly_different_configs_like_the_engine(fid, bench):
    calib_cfgs = fid.calibration_configs(bench)[:4]  # plain at 1 / 3 / 8 slots, one speculative set
    calib = fid.calibrate(bench, fid.calibration_runs(bench, calib_cfgs))
    assert calib["efficiency"]["overhead_s"] > 0
    head = (bench.heads or ["markov"])[0]
    cfgs = [bench.params(batch__max_requests=1), bench.params(batch__max_requests=2),
            bench.params(batch__max_requests=4),
            bench.params(spec__enabled=True, spec__head=head, spec__block_size=4, batch__max_requests=4)]
    meas = [statistics.median(bench.run(p, bench.eval_prompts)["tps"] for _ in range(2)) for p in cfgs]
    lengths = bench.lengths(bench.eval_prompts)
    pred = [fid.predict(bench, p, calib, lengths, seeds=2)["throughput"] for p in cfgs]
    clear = [(i, j) for i, j in combinations(range(len(cfgs)), 2)
             if max(meas[i], meas[j]) / min(meas[i], meas[j]) > MARGIN]
    assert clear, f"no clearly different pair among measured {meas}"
    wrong = [(fid.label(cfgs[i]), fid.label(cfgs[j])) for i, j in clear
             if (meas[i] > meas[j]) != (pred[i] > pred[j])]
    assert not wrong, f"misranked {wrong}: measured {meas}, predicted {pred}"
