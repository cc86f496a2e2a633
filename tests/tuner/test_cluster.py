"""The cluster planner (tuner/cluster.py): aggregated replicas against disaggregated prefill/decode workers."""

from __future__ import annotations

import pytest

from profiler.build import build_profile
from tuner.cluster import Layout, Slo, pareto, plan
from tuner.errors import TunerError


def _pt(gpu: float, user: float) -> Layout:
    return Layout("agg", 8, gpu, user, 100.0, 1e3 / user)


def test_the_front_keeps_only_points_nothing_beats_on_both_axes() -> None:
    pts = [_pt(100, 10), _pt(90, 20), _pt(95, 15), _pt(80, 15), _pt(100, 5)]
    assert [(p.tokens_per_s_gpu, p.tokens_per_s_user) for p in pareto(pts)] == [(100, 10), (95, 15), (90, 20)]


@pytest.fixture(scope="module")
def qwen() -> object:
    return build_profile("Qwen3-8B", "h100", "chat", measure=False, gpus=8)


def test_every_planned_layout_meets_the_slo_and_fits_the_cluster(qwen) -> None:
    slo = Slo(ttft_ms=1000, tpot_ms=30)
    got = plan(qwen, 8, 2000, 500, slo, cost="roofline")
    assert set(got.fronts) == {"agg", "disagg"} and all(got.fronts.values())
    for mode, front in got.fronts.items():
        for p in front:
            assert p.ttft_ms <= slo.ttft_ms and p.tpot_ms <= slo.tpot_ms and p.gpus <= 8 and p.mode == mode
            if mode == "disagg":
                assert p.gpus == p.prefill_workers * p.prefill_tp + p.decode_workers * p.decode_tp
            else:
                assert p.gpus == p.replicas * p.tp
    best = got.best()
    assert best is not None and best.tokens_per_s_gpu == max(got.best(m).tokens_per_s_gpu for m in got.fronts)


def test_a_tighter_tpot_costs_throughput_per_gpu(qwen) -> None:
    loose = plan(qwen, 8, 2000, 500, Slo(1000, 50), "agg", cost="roofline").best()
    tight = plan(qwen, 8, 2000, 500, Slo(1000, 10), "agg", cost="roofline").best()
    assert loose is not None and tight is not None
    assert tight.tokens_per_s_gpu < loose.tokens_per_s_gpu and tight.tokens_per_s_user > loose.tokens_per_s_user


def test_bad_serving_and_sizes_are_one_line(qwen) -> None:
    with pytest.raises(TunerError, match="agg, disagg or auto"):
        plan(qwen, 8, 100, 100, Slo(1000, 50), "both")
    with pytest.raises(TunerError, match="positive"):
        plan(qwen, 0, 100, 100, Slo(1000, 50))
