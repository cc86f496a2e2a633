"""The calibration data behind the speculative round costs: every published row cites its source and quotes it,
the rows that name others name real ones, and every fitted constant lists the `use: fit` rows it came from
(benchmarks/spec_published/rows.yaml, tuner/catalog/spec_costs.yaml)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tuner.methods import COSTS_FILE, engine_costs

ROWS = Path(__file__).resolve().parents[2] / "benchmarks" / "spec_published" / "rows.yaml"


def _rows() -> list[dict]:
    return yaml.safe_load(ROWS.read_text())


def test_every_row_is_sourced_quoted_and_its_references_exist() -> None:
    rows = _rows()
    ids = {r["id"] for r in rows}
    assert len(ids) == len(rows) >= 100
    for r in rows:
        assert r["use"] in ("fit", "check"), r["id"]
        assert r["source"].get("url") or r["source"].get("repo"), r["id"]
        assert len(str(r.get("quote") or "")) > 20, r["id"]
        for ref in ("relative_to", "tau_anchor"):
            if r.get(ref):
                assert r[ref] in ids, (r["id"], ref)
        m = r.get("measured") or {}
        if m.get("speedup") and m.get("acceptance_length") and r.get("steps"):
            assert 1 <= m["acceptance_length"] <= r["steps"] + 1, r["id"]


def test_fitted_constants_name_the_fit_rows_they_came_from() -> None:
    fit_ids = {r["id"] for r in _rows() if r["use"] == "fit"}
    fitted = (yaml.safe_load(COSTS_FILE.read_text()) or {}).get("fitted") or {}
    assert fitted, "run benchmarks/bench_spec_published.py --fit"
    for engine, row in fitted.items():
        assert set(row["rows"]) <= fit_ids and len(row["rows"]) >= 3, engine
        assert row["rms_log_error"] < 0.2, engine
        costs = engine_costs(engine)
        assert costs.round_s == row.get("round_us", 0) * 1e-6 and costs.request_s == row.get("request_us", 0) * 1e-6
