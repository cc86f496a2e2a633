"""The measured acceptance of the bundled engine's drafter-less methods and of the hybrid (issue 42): bench rows go
to acceptance_methods.json, `profile` reads the workload's domain, and the tuner prices each method with its own."""

from __future__ import annotations

import json
from pathlib import Path

from dspark_core.cli.acceptance_record import METHODS_FILE, _method_rows
from dspark_core.config import EngineConfig
from profiler.drafter import measured_method_acceptance
from profiler.schema import Profile
from tests.tuner.fixtures import QWEN3_8B_H100
from tuner.acceptance import acceptance_of


def _row(name: str, tau: float, pa: list[float]) -> dict:
    return {"name": name, "tau": tau, "position_acceptance": pa, "tokens_per_s": 90.0, "speedup": 2.0}


def test_bench_rows_by_method_take_verify_all_and_the_best_hybrid() -> None:
    result = {"methods": [_row("plain", 1.0, []), _row("suffix", 2.9, [0.8, 0.9]), _row("suffix/prefix", 3.5, [0.9]),
                          _row("hybrid_markov", 2.5, [0.7]), _row("hybrid_rnn", 2.7, [0.75]),
                          _row("dspark_markov", 1.5, [0.4])]}
    got = _method_rows(result, EngineConfig())
    assert set(got) == {"suffix", "hybrid"}
    assert got["suffix"]["tau"] == 2.9 and got["hybrid"]["name"] == "hybrid_rnn"


def test_profile_reads_the_domain_and_the_tuner_prices_with_it(tmp_path: Path) -> None:
    entry = {"gamma": 8, "tau": 2.98, "position_acceptance": [0.81, 0.9, 0.92, 0.95, 0.95, 0.96, 0.97, 0.97],
             "command": "python cli.py bench ..."}
    (tmp_path / METHODS_FILE).write_text(json.dumps({"methods": {"suffix": {"code": entry},
                                                                 "ngram": {"chat": entry}}}))
    got, notes = measured_method_acceptance(tmp_path, "code")
    assert set(got) == {"suffix"} and got["suffix"].tau == 2.98 and got["suffix"].domain == "code" and notes
    assert measured_method_acceptance(tmp_path, "math") == (None, [])
    prof = Profile.model_validate({**QWEN3_8B_H100, "accept_methods": {k: v.model_dump() for k, v in got.items()}})
    model = acceptance_of(prof, "suffix")
    assert model.alphas(3) == [0.81, 0.9, 0.92] and "measured" in model.source
    assert "measured" not in acceptance_of(prof, "ngram").source  # not measured on code: the published prior
