"""Feasibility after the rules (kb/feasible.py), the `around` action and the parameter lint checks."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from kb.errors import PlanConflict
from kb.lint import lint_rules
from kb.loader import load_rules
from kb.match import match_profile
from kb.rules import Action
from kb.sync import StoredRule
from profiler.build import build_profile


@cache
def _rules() -> tuple[StoredRule, ...]:
    return tuple(StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules())


def _plan(model: str, gpu: str, gpus: int | None):
    return match_profile(list(_rules()), build_profile(model, gpu, "chat", measure=False, gpus=gpus))


def _values(plan, name):
    if name in plan.fixed:
        return [plan.fixed[name].value]
    e = plan.space[name]
    assert e.kind == "choices", f"{name} is a {e.kind}, not a choice list"
    return e.choices


def test_fp8_on_one_gpu_keeps_tp_1_instead_of_forcing_tp_2():
    plan = _plan("qwen3-8b", "l4", 8)  # bf16 needs TP 2 on a 24 GB L4, FP8 fits one
    assert _values(plan, "parallel.tp")[0] == 1 and set(_values(plan, "parallel.tp")) <= {1, 2, 4, 8}
    assert "bf16" not in _values(plan, "weights.dtype") and "fp8" in _values(plan, "weights.dtype")


def test_tp_never_exceeds_the_devices_and_is_a_power_of_two():
    plan = _plan("llama-3.1-70b", "a100-80gb", 2)
    assert _values(plan, "parallel.tp") == [2]
    assert all(t in (1, 2, 4, 8, 16) for t in _values(_plan("qwen3-32b", "h100", 8), "parallel.tp"))


def test_the_memory_minimum_is_kept():
    assert _values(_plan("llama-3.1-70b", "l4", 8), "parallel.tp") == [8]  # 70 GB of FP8 over 24 GB GPUs


def test_expert_parallel_divides_tp_and_the_experts():
    plan = _plan("deepseek-v3", "b200", 8)
    tp, ep = _values(plan, "parallel.tp"), _values(plan, "parallel.ep")
    assert ep == sorted(ep, reverse=True) and all(t % e == 0 and 256 % e == 0 for t in tp for e in ep)


def test_no_layout_is_one_line_naming_the_limit():
    with pytest.raises(PlanConflict) as e:
        _plan("deepseek-v3", "h100", 8)
    msg = str(e.value)
    assert "\n" not in msg and "no parallel layout runs DeepSeek-V3 on 8 x H100-SXM" in msg and "GiB" in msg


def test_around_ranges_follow_the_profile():
    plan = _plan("qwen3-8b", "h100", 1)
    e = plan.space["batch.chunked_prefill"]  # SGLang's own 8192 on an H100, x [0.5, 2]
    assert (e.low, e.high) == (4096, 16384) and "batch.sglang-defaults.chunked-prefill" in e.rules
    assert any("around derived.sglang_chunked_prefill = 8192" in r for r in plan.resolutions)


@pytest.mark.parametrize("bad", [
    {"param": "batch.chunked_prefill", "around": "derived.sglang_chunked_prefill"},  # no band
    {"param": "batch.chunked_prefill", "around": "hw.arch", "factor": [0.5, 2]},  # not a number
    {"param": "batch.chunked_prefill", "around": "derived.sglang_chunked_prefill", "factor": [2, 1]},
    {"param": "spec.head", "around": "derived.verify_budget", "offset": [0, 1]},  # a categorical parameter
    {"param": "batch.chunked_prefill", "factor": [0.5, 2]},  # a band without around
])
def test_around_is_validated(bad):
    with pytest.raises(ValueError):
        Action.model_validate(bad)


def _lint_one(tmp_path: Path, action: str):
    (tmp_path / "memory.yaml").write_text(f"""
- id: t.one
  title: A rule under test
  category: memory
  then:
    - {action}
  rationale: Only for the lint test here.
  references: ["tests/kb/test_feasible.py"]
""")
    return lint_rules(tmp_path)[1]


def test_lint_flags_a_range_on_an_exporter_only_parameter(tmp_path):
    kinds = [f.kind for f in _lint_one(tmp_path, "{param: memory.page_size, range: [16, 64]}")]
    assert kinds == ["unsearchable"]
    assert not _lint_one(tmp_path, "{param: memory.page_size, choices: [16, 64], prefer: 16}")


def test_lint_flags_a_parameter_nothing_reads(tmp_path, monkeypatch):
    import kb.lint
    from kb.params import ParamSpec

    monkeypatch.setattr(kb.lint, "param_spec", lambda name: ParamSpec(name, "int", (1, 256), "", ()))
    kinds = [f.kind for f in _lint_one(tmp_path, "{param: memory.page_size, set: 16}")]
    assert kinds == ["inert"]


def test_expert_parallel_is_searched_from_the_rules_preferred_size():
    """EP is a choice (the simulator prices it through AIC's tables), starting from the rules' EP 8 on a full node;
    a study priced by the roofline, which cannot tell EP sizes apart, runs that one (tuner/study.py)."""
    from tuner.space import fixed_at_start, space_from_plan

    plan = _plan("deepseek-v3", "b200", 8)
    assert _values(plan, "parallel.ep") == [8, 4, 2, 1] and plan.prefer["parallel.ep"].value == 8
    space = space_from_plan(plan)
    assert "parallel.ep" in space.distributions and space.warm_start["parallel.ep"] == 8
    fixed = fixed_at_start(space, ("parallel.ep",))
    assert fixed.fixed["parallel.ep"] == 8 and "parallel.ep" not in fixed.distributions
    assert "parallel.ep" not in fixed.warm_start


def test_dp_attention_stays_a_choice_only_where_its_weight_copies_fit():
    """With data-parallel attention every GPU holds a whole copy of the non-expert weights: DeepSeek-V4-Flash's fit
    8 L40S at TP 8 as TP attention, not as DP attention, so the plan keeps TP attention and says why; DeepSeek-V3 on 8
    H200s holds both."""
    plan = _plan("deepseek-v4-flash", "l40s", 8)
    assert _values(plan, "parallel.dp_attention") == [False]
    assert any(r.startswith("parallel.dp_attention: data-parallel attention does not fit") for r in plan.resolutions)
    assert set(_values(_plan("deepseek-v3", "h200", 8), "parallel.dp_attention")) == {True, False}
