"""serve's online batching decisions: timeout from the arrival rate, block length from the SPS table and the
measured acceptance, admission under a TTFT SLO; static keeps the config's values."""

from __future__ import annotations

import pytest

from dspark_core.serving.batcher import Batcher
from dspark_core.verification.sps import SpsTable


def affine(a_s: float, b_s: float, n: int = 512) -> SpsTable:
    """Step seconds a + b * tokens, as the engine's CPU table."""
    return SpsTable.from_probes((t, 1.0 / (a_s + b_s * t)) for t in range(1, n + 1))


def test_timeout_waits_only_when_the_next_arrival_is_near() -> None:
    b = Batcher(slots=8, timeout_s=0.02, gamma=4, sps=None)
    for t in (0.0, 1.0, 2.0):  # one arrival a second: a 20 ms wait would only add latency
        b.arrival(t)
    assert b.decide(2.0, running=0, waiting=1).wait_s == 0.0
    for i in range(200):  # 1000 per second: the next one is ~1 ms away
        b.arrival(3.0 + i / 1000)
    assert 0 < b.decide(3.2, running=0, waiting=1).wait_s <= 0.02
    assert b.decide(3.2, running=2, waiting=1).wait_s == 0.0  # a running batch never waits
    static = Batcher(slots=8, timeout_s=0.02, gamma=4, sps=None, adaptive=False)
    assert static.decide(0.0, running=0, waiting=1).wait_s == 0.02
    assert static.decide(0.0, running=0, waiting=8).wait_s == 0.0  # full: nothing to wait for


def test_block_length_follows_the_load() -> None:
    sps = affine(0.010, 0.0005)  # a fixed 10 ms plus 0.5 ms per verified token
    b = Batcher(slots=64, timeout_s=0.0, gamma=8, sps=sps)
    b.rounds([80] * 8, [100] * 8)  # acceptance 0.8 at every position
    assert b.alphas() == pytest.approx([0.8] * 8, abs=0.005)
    light = b.decide(0.0, running=1, waiting=0).gamma
    heavy = b.decide(0.0, running=64, waiting=0).gamma
    assert light == 8 and 0 < heavy < light  # nearly free at B = 1, costly at B = 64
    best = max(range(9), key=lambda g: b.rate_at(g, 64))
    assert heavy == best
    b.rounds([5] * 8, [1000] * 8)  # acceptance collapses: plain decoding wins
    assert b.decide(0.0, running=64, waiting=0).gamma == 0
    probes = [b.decide(0.0, running=64, waiting=0).gamma for _ in range(40)]
    assert probes.count(4) == 1 and set(probes) == {0, 4}  # one drafting step in 32 keeps measuring
    static = Batcher(slots=64, timeout_s=0.0, gamma=8, sps=sps, adaptive=False)
    static.rounds([5] * 8, [1000] * 8)
    assert static.decide(0.0, running=64, waiting=0).gamma == 8


def test_hysteresis_keeps_a_nearly_equal_block() -> None:
    b = Batcher(slots=8, timeout_s=0.0, gamma=6, sps=affine(0.01, 0.0001))
    b.rounds([90] * 6, [100] * 6)
    g = b.decide(0.0, running=4, waiting=0).gamma
    switches = b.switches
    for _ in range(10):
        assert b.decide(0.0, running=4, waiting=0).gamma == g
    assert b.switches == switches


def test_admission_under_a_ttft_slo() -> None:
    b = Batcher(slots=4, timeout_s=0.0, gamma=0, sps=None, ttft_slo_s=0.5)
    assert b.admit(100) == (True, None)  # no finished request yet: nothing to predict from
    b.finished(0.3)
    assert b.admit(3)[0] and b.admit(4)[0]  # one batch ahead: 0.3 s
    ok, ttft = b.admit(8)
    assert not ok and ttft == pytest.approx(0.6)
    assert Batcher(slots=4, timeout_s=0.0, gamma=0, sps=None, adaptive=False, ttft_slo_s=0.5).admit(80)[0]


def test_admission_cap_meets_a_tpot_slo() -> None:
    sps = affine(0.010, 0.001)  # 10 ms + 1 ms per verified token
    free = Batcher(slots=32, timeout_s=0.0, gamma=4, sps=sps)
    assert free.decide(0.0, running=0, waiting=5).cap is None  # no SLO: every slot
    b = Batcher(slots=32, timeout_s=0.0, gamma=4, sps=sps, tpot_slo_s=0.012)
    b.rounds([70] * 4, [100] * 4)
    cap = b.decide(0.0, running=0, waiting=5).cap
    assert cap is not None and 1 <= cap < 32
    assert b.tpot_s(cap) <= 0.012 < b.tpot_s(cap + 1)
    tight = Batcher(slots=32, timeout_s=0.0, gamma=4, sps=sps, tpot_slo_s=0.001)
    assert tight.decide(0.0, running=0, waiting=5).cap == 1  # nothing meets it: one request at a time
