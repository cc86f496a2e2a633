"""Smoke test of benchmarks/bench_search.py on a tiny grid (the benchmark itself never gates CI)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_search", ROOT / "benchmarks" / "bench_search.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_search"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def case(bench):
    return bench.make_case("qwen3-8b", "h100", "chat", n_requests=4)


def test_four_bit_weights_need_the_relaxed_quality_floor(bench, case):
    params = case.rule_space.params_of(case.rule_space.warm_start)
    ev = case.scorer.evaluator.evaluate({**params, "weights.dtype": "int4"})
    assert not ev.feasible and "--quality relaxed" in ev.why
    assert "int4" not in case.rule_space.distributions["weights.dtype"].choices  # quant.quality.4bit-opt-in


def test_scorer_memoises_and_zeroes_slo_misses(bench, case):
    params = case.rule_space.params_of({**{k: d.low if hasattr(d, "low") else d.choices[0]
                                          for k, d in case.rule_space.distributions.items()},
                                       **case.rule_space.warm_start})
    v = case.scorer(params)
    calls = case.scorer.calls
    assert v > 0 and case.scorer(dict(params)) == v and case.scorer.calls == calls
    # a parameter the simulator does not read shares the memo entry
    other = {**params, "kernel.rmsnorm.num_warps": 4 if params.get("kernel.rmsnorm.num_warps") != 4 else 8}
    assert case.scorer(other) == v and case.scorer.calls == calls
    strict = bench.Scorer(case.scorer.evaluator, slo_tpot_ms=1e-6, slo_ttft_ms=None)
    assert strict(params) == 0.0  # misses the TPOT SLO


def test_recorder_rejects_unlisted_parameter(bench):
    rec = bench._Recorder({"spec.block_size": 4, "kernel.swiglu.BLOCK": 1024})
    assert rec["spec.block_size"] == 4
    with pytest.raises(RuntimeError, match="SENSITIVE"):
        rec.get("kernel.swiglu.BLOCK")


def test_free_space_adds_every_simulated_parameter(bench, case):
    free, rules = case.free_space.distributions, case.rule_space.distributions
    held, _ = bench.checkpoint_held(case.profile)  # the rank, and the deployed checkpoint's head and depth
    assert set(bench.SENSITIVE) - set(held) <= set(free)
    for k, v in held.items():  # checkpoint properties are held, never searched
        assert k not in free and k not in rules
        assert case.free_space.defaults[k] == v == case.rule_space.params_of({})[k]  # fixed by the plan or held
    assert all(k.startswith("kernel.") for k in set(rules) - set(free))  # no registry domain to widen to
    assert free["batch.max_requests"].high == 4096 and free["parallel.tp"].high == 64


def test_tiny_grid_optimum_and_both_searches(bench, case):
    grid = {"weights.dtype": ["auto", "fp8"], "spec.block_size": [4, 8]}
    polish = {"kv.dtype": ["auto", "fp8_e4m3"]}
    opt = bench.reference_optimum(case, grid=grid, polish=polish, max_passes=1)
    assert opt.grid_points == 4 + 2  # 2 x 2 with speculation, 2 dtypes without
    assert opt.value >= opt.grid_value > 0
    assert case.scorer({**case.rule_space.defaults, **opt.params}) == opt.value
    inside, at = bench.rule_space_best(case, opt, polish=polish, max_passes=1)
    assert 0 < inside == case.scorer(at) <= max(v for v, _ in case.scorer.memo.values())
    assert all(at[k] == v for k, v in case.rule_space.fixed.items())
    refined = bench.refine_optimum(case, opt, at, polish=polish, max_passes=1)
    assert refined.value >= max(opt.value, inside) and refined.evaluations == case.scorer.calls
    for method in ("rules", "default"):
        curve = bench.search_curve(case, method, seed=0, n_trials=3)
        assert len(curve) == 3 and curve == sorted(curve)
    assert len(bench.search_curve(case, "default", seed=0, n_trials=2, stop_at=1e12)) == 2  # never reached
    stopped = bench.search_curve(case, "rules", seed=0, n_trials=5, stop_at=0.0)
    assert len(stopped) == 1  # the warm start already reaches a target of 0


def test_trials_to_and_median(bench):
    assert bench.trials_to([0.0, 5.0, 9.0], 9.0) == 3 and bench.trials_to([1.0], 2.0) is None
    assert bench.median_trials([3, 5, None, 2, 4], cap=10) == 4
    assert bench.median_trials([None, None, None, 2, 4], cap=10) is None


def test_write_section_replaces_only_its_own(bench, tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## Other\n\nkeep me\n")
    bench.write_section("first table\n", path)
    bench.write_section("second table\n", path)
    text = path.read_text()
    assert "keep me" in text and "second table" in text and "first table" not in text
    assert text.count(bench.SECTION) == 1
    path.write_text(text + "\n## Later\n\nalso kept\n")
    bench.write_section("third\n", path)
    text = path.read_text()
    assert "also kept" in text and "third" in text and text.count(bench.SECTION) == 1


def test_render_writes_both_tables(bench):
    import argparse

    b = bench
    from search_report import render

    params = {"weights.dtype": "fp8", "kv.dtype": "auto", "parallel.tp": 1, "batch.max_requests": 8,
              "spec.enabled": True, "spec.block_size": 7, "spec.head": "markov", "spec.scheduler": "prefix",
              "spec.max_verify_tokens": 8, "spec.draft_layers": 2}
    opt = b.Optimum(100.0, params, 90.0, 12, 30)
    res = b.CaseResult("m / g / w", opt, [5, None], [None, 40], 10, 20, [0.99, 0.9], [0.8, 0.99],
                       30, 1.5, ["spec.block_size=9 outside [4, 8] (r)"], 95.0, 100.0)
    opts = argparse.Namespace(rule_cap=60, default_cap=150, target=0.98, seeds=[0, 1], requests=16, jobs=1,
                              sim_seed=0)
    text = render([res], opts, "python benchmarks/bench_search.py", 12.0, "abc123", b.GRID, b.POLISH)
    assert "| m / g / w |" in text and "spec.block_size=9 outside" in text


def test_render_seed_counts_cases_within_30(bench):
    import argparse

    b = bench
    from search_report import render_seed

    params = {"weights.dtype": "fp8", "parallel.tp": 1, "batch.max_requests": 8, "spec.block_size": 7,
              "spec.head": "markov", "spec.scheduler": "prefix", "spec.max_verify_tokens": 8, "spec.draft_layers": 2}
    opt = b.Optimum(100.0, params, 90.0, 12, 30)
    fast = b.CaseResult("a / g / w", opt, [12], [None], 10, 20, [1.0], [0.0], 30, 1.5, [], 99.0, 100.0)
    slow = b.CaseResult("b / g / w", opt, [31], [None], 10, 20, [1.0], [0.0], 30, 1.5, [], 99.0, 100.0)
    opts = argparse.Namespace(rule_cap=60, target=0.98, sim_seed=2)
    text = render_seed([fast, slow], opts, "python benchmarks/bench_search.py --sim-seed 2", 3.0, "abc123")
    assert "| a / g / w | 100 | " in text and "| 12 (12) | yes |" in text and "| 31 (31) | no |" in text
    assert text.endswith("Within 30 trials at simulator seed 2: 1/2 cases.")
