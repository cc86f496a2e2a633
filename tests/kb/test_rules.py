"""Rule schema and condition evaluator: every operator, every action kind, clear load errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kb.errors import RuleError
from kb.fields import flatten
from kb.loader import load_all, load_rules
from kb.rules import Rule, evaluate
from profiler.schema import Profile
from tests.kb.helpers import rule, write_rules

H100 = Profile.model_validate({
    "model": {"name": "Qwen3-8B", "arch": "dense", "params_total": 8.19e9, "ops": {"rmsnorm": 4}},
    "hw": {"name": "H100-SXM", "arch": "hopper", "sm": 90, "fp8": True, "memory_gb": 80},
    "workload": {"domain": "code", "concurrency": 8},
})
FLAT = flatten(H100)


def cond(c):
    return Rule.model_validate(rule("t", [{"advise": "x"}], when=c)).when


@pytest.mark.parametrize("c, expected", [
    ({"field": "hw.arch", "eq": "hopper"}, True),
    ({"field": "hw.arch", "eq": "ampere"}, False),
    ({"field": "hw.arch", "ne": "ampere"}, True),
    ({"field": "hw.sm", "lt": 90}, False),
    ({"field": "hw.sm", "le": 90}, True),
    ({"field": "hw.sm", "gt": 89}, True),
    ({"field": "hw.sm", "ge": 91}, False),
    ({"field": "hw.arch", "in": ["hopper", "blackwell"]}, True),
    ({"field": "hw.arch", "not_in": ["hopper", "blackwell"]}, False),
    ({"field": "model.params_total", "between": [7e9, 9e9]}, True),
    ({"field": "model.params_total", "between": [1e9, 2e9]}, False),
    ({"field": "model.num_experts", "exists": False}, True),
    ({"field": "model.ops.rmsnorm", "exists": True}, True),
    ({"field": "model.ops.rmsnorm", "ge": 4}, True),
    ({"field": "model.name", "matches": "^Qwen3-"}, True),
    ({"field": "model.name", "matches": "llama"}, False),
    ({"field": "hw.fp8", "eq": True}, True),
    ({"field": "hw.fp8", "eq": 1}, False),  # a bool is not the number 1
    ({"all": [{"field": "hw.arch", "eq": "hopper"}, {"field": "workload.domain", "eq": "code"}]}, True),
    ({"any": [{"field": "hw.arch", "eq": "ampere"}, {"field": "workload.domain", "eq": "code"}]}, True),
    ({"not": {"field": "hw.arch", "eq": "hopper"}}, False),
    # a missing field makes every comparison false, and only `exists: false` / `not` true
    ({"field": "workload.slo.tpot_ms", "lt": 100}, False),
    ({"field": "workload.slo.tpot_ms", "ne": 5}, False),
    ({"not": {"field": "workload.slo.tpot_ms", "lt": 100}}, True),
])
def test_operators(c, expected):
    assert evaluate(cond(c), FLAT) is expected


def test_no_condition_always_fires():
    assert evaluate(None, {}) is True


@pytest.mark.parametrize("bad, message", [
    ({"field": "hw.archh", "eq": "hopper"}, "unknown profile field 'hw.archh'"),
    ({"field": "hw.arch", "like": "hopper"}, "unknown operator 'like'"),
    ({"field": "hw.arch", "eq": "a", "ne": "b"}, "exactly one op"),
    ({"field": "hw.sm", "lt": "ninety"}, "lt needs a number"),
    ({"field": "hw.arch", "gt": 3}, "compares numbers but hw.arch is a str"),
    ({"field": "hw.sm", "between": [10, 1]}, "low <= high"),
    ({"field": "hw.sm", "in": []}, "non-empty list"),
    ({"field": "hw.sm", "exists": "yes"}, "exists needs true or false"),
    ({"field": "model.name", "matches": "("}, "invalid regular expression"),
])
def test_bad_conditions(bad, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        cond(bad)


@pytest.mark.parametrize("action, kind", [
    ({"param": "spec.block_size", "set": 7}, "set"),
    ({"param": "spec.block_size", "range": [4, 16], "prefer": 7}, "range"),
    ({"param": "spec.head", "choices": ["markov", "rnn"]}, "choices"),
    ({"param": "kv.dtype", "forbid": ["fp8_e5m2"]}, "forbid"),
    ({"param": "spec.head", "prefer": "markov"}, "prefer"),
    ({"advise": "Profile the SPS table on the serving GPU."}, "advise"),
    ({"param": "kernel.rmsnorm.num_warps", "range": [1, 8]}, "range"),
])
def test_action_kinds(action, kind):
    r = Rule.model_validate(rule("t", [action]))
    assert r.then[0].kind == kind


@pytest.mark.parametrize("action, message", [
    ({"param": "spec.blocksize", "set": 7}, "unknown parameter"),
    ({"param": "spec.block_size", "set": 99}, "does not fit"),
    ({"param": "spec.head", "set": "lstm"}, "does not fit"),
    ({"param": "spec.head", "range": [1, 2]}, "not a number"),
    ({"param": "spec.block_size", "range": [8, 4]}, "low <= high"),
    ({"param": "spec.block_size", "range": [4, 8], "prefer": 12}, "outside range"),
    ({"param": "spec.block_size", "set": 4, "range": [1, 8]}, "one kind"),
    ({"param": "spec.block_size"}, "needs one of"),
    ({"set": 4}, "needs a param"),
])
def test_bad_actions(action, message):
    with pytest.raises(ValidationError, match=message):
        Rule.model_validate(rule("t", [action]))


def test_rule_needs_a_reference():
    r = rule("t", [{"advise": "x"}])
    r["references"] = []
    with pytest.raises(ValidationError, match="references"):
        Rule.model_validate(r)


def test_unknown_key_is_rejected():
    r = rule("t", [{"advise": "x"}])
    r["colour"] = "blue"
    with pytest.raises(ValidationError, match="colour"):
        Rule.model_validate(r)


def test_loader_names_file_line_and_rule(tmp_path):
    good = rule("a.good", [{"advise": "x"}])
    bad = rule("b.bad", [{"param": "spec.block_size", "set": 0}])
    write_rules(tmp_path, [good, bad])
    rules, errors = load_all(tmp_path)
    assert [r.id for r in rules] == ["a.good"]
    assert len(errors) == 1 and errors[0].rule_id == "b.bad" and errors[0].file == "test.yaml"
    assert errors[0].line > 1
    with pytest.raises(RuleError, match=r"test.yaml:\d+ \(rule b.bad\)"):
        load_rules(tmp_path)


def test_duplicate_ids_across_files(tmp_path):
    write_rules(tmp_path, [rule("same", [{"advise": "x"}])], "a.yaml")
    write_rules(tmp_path, [rule("same", [{"advise": "y"}])], "b.yaml")
    _, errors = load_all(tmp_path)
    assert any("duplicate rule id" in str(e) and "a.yaml" in str(e) for e in errors)


def test_malformed_yaml_and_duplicate_keys(tmp_path):
    (tmp_path / "x.yaml").write_text("- id: a\n  title: [unclosed\n")
    (tmp_path / "y.yaml").write_text("- id: a\n  id: b\n")
    _, errors = load_all(tmp_path)
    text = " | ".join(map(str, errors))
    assert "x.yaml:" in text and "malformed YAML" in text
    assert "duplicate key 'id'" in text


def test_yaml12_floats(tmp_path):
    (tmp_path / "f.yaml").write_text(
        "- id: f\n  title: Floats\n  category: speculative\n  when: {field: model.params_total, le: 14.0e9}\n"
        "  then: [{advise: x}]\n  rationale: YAML 1.2 float syntax.\n  references: [here]\n")
    [lr] = load_rules(tmp_path)
    assert lr.rule.when.value == 14.0e9


def test_missing_folder(tmp_path):
    with pytest.raises(RuleError, match="does not exist"):
        load_rules(tmp_path / "nope")
