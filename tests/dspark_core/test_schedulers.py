"""Schedulers on plain numbers: bounds, Algorithm 1 arithmetic, threshold, top-K, async capacity."""

from __future__ import annotations

import random

import pytest
import torch

from dspark_core.verification.schedulers import (
    AsyncTopKScheduler,
    as_rows,
    make_scheduler,
    prefix_schedule,
    prefix_survival,
    threshold_lengths,
    topk_lengths,
    verify_all,
)
from dspark_core.verification.sps import SpsTable

FLAT = SpsTable.flat(1024)


def _jagged() -> SpsTable:
    return SpsTable.from_probes([(1, 100.0), (4, 95.0), (8, 60.0), (12, 58.0), (16, 30.0)], 64)


def test_survival_is_the_cumulative_product() -> None:
    assert prefix_survival([[0.5, 0.5, 1.0], []]) == [[0.5, 0.25, 0.25], []]


def test_as_rows_accepts_tensors_and_lengths() -> None:
    rows = as_rows(torch.tensor([[0.9, 0.8, 0.7], [1.5, -0.1, 0.3]]), lengths=[3, 1])
    assert rows[0] == pytest.approx([0.9, 0.8, 0.7]) and rows[1] == [1.0]  # clamped to [0, 1], truncated


def test_algorithm_1_hand_computed() -> None:
    # R = 1, SPS(1) = 1, SPS(2) = 0.5, SPS(3) = 0.45: Theta_0 = 1.0 > Theta_1 = 1.8 * 0.5 -> l = 0.
    sps = SpsTable.from_probes([(1, 1.0), (2, 0.5), (3, 0.45)])
    d = prefix_schedule([[0.8, 0.9]], sps)
    assert d.lengths == [0] and d.batch_tokens == 1 and d.throughput == pytest.approx(1.0)
    # the retrospective search looks past the dip and takes both tokens: (1 + 0.8 + 0.72) * 0.45
    d = prefix_schedule([[0.8, 0.9]], sps, early_stop=False)
    assert d.lengths == [2] and d.throughput == pytest.approx(2.52 * 0.45)
    # flat cost: every candidate with a > 0 improves Theta, so everything is verified
    assert prefix_schedule([[0.9, 0.5], [0.2], [0.0, 0.9]], FLAT).lengths == [2, 1, 0]


def test_prefix_admits_in_global_survival_order() -> None:
    # SPS halves at 4 tokens: with R = 2 only one extra token is worth it, the most confident one.
    sps = SpsTable.from_probes([(1, 1.0), (4, 0.5)])
    assert prefix_schedule([[0.6, 0.6], [0.9, 0.9]], sps).lengths == [0, 1]


def test_prefix_respects_max_batch_tokens() -> None:
    sps = SpsTable.from_probes([(1, 1.0)], max_batch_tokens=5)
    d = prefix_schedule([[0.99] * 8, [0.98] * 8], sps)
    assert d.batch_tokens == 5 and sum(d.lengths) == 3


def test_threshold_is_a_prefix_of_survival() -> None:
    assert threshold_lengths([[0.9, 0.9, 0.9], [0.4, 1.0], []], 0.8) == [2, 0, 0]
    assert threshold_lengths([[0.9, 0.9, 0.9]], 0.0) == [3]


def test_topk_takes_highest_survival_as_prefixes() -> None:
    rows = [[0.9, 0.9, 0.5], [0.95, 0.1]]  # survivals [.9, .81, .405], [.95, .095]
    assert topk_lengths(rows, 0) == [0, 0]
    assert topk_lengths(rows, 2) == [1, 1]
    assert topk_lengths(rows, 3) == [2, 1]
    assert topk_lengths(rows, 99) == [3, 2]


@pytest.mark.parametrize("name", ["verify_all", "threshold", "prefix", "async_topk"])
def test_every_scheduler_returns_a_valid_length_per_request(name: str) -> None:
    rng = random.Random(7)
    sched = make_scheduler(name, sps=_jagged(), threshold=0.3)
    for _ in range(200):
        n_req = rng.randint(1, 8)
        rows = [[rng.random() ** 0.3 for _ in range(rng.randint(0, 16))] for _ in range(n_req)]
        lengths = sched.schedule(rows)
        assert len(lengths) == n_req
        assert all(0 <= n <= len(r) for n, r in zip(lengths, rows, strict=True))


def test_prefix_never_worse_than_verify_nothing_and_early_stop_is_a_prefix_of_the_search() -> None:
    rng = random.Random(3)
    sps = _jagged()
    for _ in range(200):
        rows = [[rng.random() ** 0.2 for _ in range(7)] for _ in range(rng.randint(1, 6))]
        stop = prefix_schedule(rows, sps)
        full = prefix_schedule(rows, sps, early_stop=False)
        assert stop.throughput >= len(rows) * sps.lookup(len(rows)) - 1e-12
        assert full.throughput >= stop.throughput - 1e-12
        assert all(a <= b for a, b in zip(stop.lengths, full.lengths, strict=True))


def test_async_topk_sizes_k_from_confidences_two_rounds_old() -> None:
    sps = SpsTable.from_probes([(1, 1.0), (2, 0.6), (3, 0.59), (4, 0.2)])
    sched = AsyncTopKScheduler(sps=sps)
    confident = [[0.99, 0.99, 0.99]]
    hopeless = [[0.01, 0.01, 0.01]]
    first = sched.schedule(hopeless)  # warm-up: Algorithm 1 on the current round
    assert first == [0] and sched.last_capacity is None
    sched.schedule(confident)  # warm-up again
    # round 3: K comes from round 1 (hopeless -> K = 0) even though this round is confident
    assert sched.schedule(confident) == [0] and sched.last_capacity == 0
    # round 4: K from round 2 (confident): the cliff at 4 tokens caps it at 2 draft tokens (B = 3)
    assert sched.schedule(hopeless) == [2] and sched.last_capacity == 2
    sched.reset()
    assert sched.schedule(confident) == prefix_schedule(confident, sps).lengths


def test_async_capacity_uses_the_search_without_early_stop() -> None:
    # a dip at B = 2 then a plateau: Algorithm 1 stops at the dip, the unconstrained search crosses it.
    sps = SpsTable.from_probes([(1, 1.0), (2, 0.5), (3, 0.45)])
    sched = AsyncTopKScheduler(sps=sps)
    assert sched.capacity_from([[0.8, 0.9]]) == 2
    assert prefix_schedule([[0.8, 0.9]], sps).lengths == [0]


def test_make_scheduler_validates() -> None:
    assert make_scheduler("verify_all").schedule([[0.1, 0.2]]) == verify_all([[0.1, 0.2]])
    with pytest.raises(ValueError, match="SPS"):
        make_scheduler("prefix")
    with pytest.raises(ValueError, match="unknown"):
        make_scheduler("nope")
    with pytest.raises(ValueError, match="threshold"):
        make_scheduler("threshold", threshold=2.0)


def test_ragged_pricing_and_round_overhead() -> None:
    sps = SpsTable.from_probes([(1, 100.0), (2, 90.0), (4, 50.0), (6, 45.0)], 64)
    rows = [[0.9, 0.9], [0.5]]
    # ragged pricing: B = 2 + admitted tokens
    flat = prefix_schedule(rows, sps)
    assert flat.lengths == [1, 0] and flat.batch_tokens == 3  # 2.9 * SPS(3) = 261 > 2 * SPS(2) = 180
    # a large fixed per-round cost makes every extra token nearly free: verify everything
    heavy = prefix_schedule(rows, sps, overhead_s=1.0)
    assert heavy.lengths == [2, 1]
    assert heavy.throughput == pytest.approx((1 + 0.9 + 0.81 + 1 + 0.5) / (1 / 50.0 + 1.0))  # B = 5: SPS(4)
