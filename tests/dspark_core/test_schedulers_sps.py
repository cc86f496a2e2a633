"""SPS table: SGLang SpsCostTable JSON round trip, validation, step-function lookup, profiling."""

from __future__ import annotations

import json

import pytest

from dspark_core.errors import DSparkError
from dspark_core.verification.sps import SpsTable, default_probes, profile_sps


def _table() -> SpsTable:
    return SpsTable((8, 16, 32, 64), (1000.0, 950.0, 500.0, 480.0), 128)


def test_lookup_is_a_step_function_on_the_lower_probe() -> None:
    t = _table()
    assert [t.lookup(b) for b in (8, 16, 32, 64)] == [1000.0, 950.0, 500.0, 480.0]
    assert t.lookup(31) == 950.0 and t.lookup(63) == 500.0
    assert t.lookup(1) == 1000.0  # below the first probe: the first probe
    assert t.lookup(10_000) == 480.0  # above the last probe: the last probe


@pytest.mark.parametrize("tokens,sps,max_bt", [
    ((8, 8), (1.0, 2.0), 8),  # not strictly increasing
    ((16, 8), (1.0, 2.0), 16),  # unsorted
    ((8, 16), (1.0,), 16),  # length mismatch
    ((), (), 0),  # empty
    ((8, 16), (1.0, 2.0), 15),  # max below the last probe
    ((8,), (0.0,), 8),  # non-positive speed
])
def test_invalid_tables_are_rejected(tokens: tuple, sps: tuple, max_bt: int) -> None:
    with pytest.raises(ValueError):
        SpsTable(tokens, sps, max_bt)


def test_save_load_round_trip_uses_sglang_field_names(tmp_path) -> None:
    t = _table()
    path = tmp_path / "sps.json"
    t.save(path)
    raw = json.loads(path.read_text())
    assert set(raw) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    loaded = SpsTable.load(path)
    assert loaded == t
    assert [loaded.lookup(b) for b in (1, 8, 31, 64, 200)] == [t.lookup(b) for b in (1, 8, 31, 64, 200)]
    assert not list(tmp_path.glob(".sps.json.*"))  # no temp file left behind


def test_bad_files_are_one_line_errors(tmp_path) -> None:
    with pytest.raises(DSparkError, match="not found"):
        SpsTable.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"sample_batch_tokens": [4, 2], "sample_steps_per_sec": [1, 1], "max_batch_tokens": 4}')
    with pytest.raises(DSparkError, match="strictly increasing"):
        SpsTable.load(bad)
    bad.write_text("{not json")
    with pytest.raises(DSparkError, match="JSON"):
        SpsTable.load(bad)
    bad.write_text('{"bias_seconds": 0.1, "bs_probes": [1], "alpha_seconds": [0], "m_probes": [1],'
                   ' "theta_seconds": [0]}')
    with pytest.raises(DSparkError, match="additive"):
        SpsTable.load(bad)


def test_from_probes_sorts_and_rejects_duplicates() -> None:
    t = SpsTable.from_probes([(32, 500.0), (8, 1000.0), (16, 950.0)])
    assert t.sample_batch_tokens == (8, 16, 32) and t.max_batch_tokens == 32
    with pytest.raises(ValueError):
        SpsTable.from_probes([(8, 1.0), (8, 2.0)])


def test_default_probes_cover_the_range() -> None:
    p = default_probes(64)
    assert p[0] == 1 and p[-1] == 64 and p == sorted(set(p))
    assert default_probes(1) == [1]


def test_profile_measures_with_the_given_clock_and_is_monotone() -> None:
    now = [0.0]
    cost = {1: 0.010, 2: 0.010, 4: 0.009, 8: 0.030}  # the 4-token step is "faster" (jitter)

    def clock() -> float:
        return now[0]

    def step(b: int) -> None:
        now[0] += cost[b]

    t = profile_sps(step, [8, 1, 2, 4], warmup=0, repeats=3, clock=clock, max_batch_tokens=16)
    assert t.sample_batch_tokens == (1, 2, 4, 8) and t.max_batch_tokens == 16
    assert t.lookup(1) == pytest.approx(100.0)
    assert t.lookup(4) == pytest.approx(100.0)  # clipped: never faster than a smaller batch
    assert t.lookup(8) == pytest.approx(1 / 0.030)
