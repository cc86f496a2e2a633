"""Lint: load errors, never-firing rules, contradictory rules that can fire together."""

from __future__ import annotations

from kb.lint import lint_rules, satisfiable
from kb.rules import Rule
from tests.kb.helpers import rule, write_rules


def when(c):
    return Rule.model_validate(rule("t", [{"advise": "x"}], when=c)).when


def kinds(findings):
    return sorted(f.kind for f in findings)


def test_clean_folder(tmp_path):
    write_rules(tmp_path, [rule("a", [{"param": "spec.block_size", "range": [4, 8]}],
                                {"field": "hw.arch", "eq": "hopper"}),
                           rule("b", [{"param": "spec.block_size", "range": [2, 4]}],
                                {"field": "hw.arch", "eq": "ampere"})])
    _, findings = lint_rules(tmp_path)
    assert findings == []


def test_never_fires():
    assert not satisfiable(when({"all": [{"field": "hw.sm", "gt": 90}, {"field": "hw.sm", "lt": 80}]}))
    assert not satisfiable(when({"field": "hw.arch", "eq": "hoper"}))  # not in the Literal domain
    assert not satisfiable(when({"all": [{"field": "hw.arch", "in": ["hopper"]},
                                         {"field": "hw.arch", "not_in": ["hopper"]}]}))
    assert not satisfiable(when({"all": [{"field": "hw.sm", "exists": False}, {"field": "hw.sm", "ge": 1}]}))
    assert not satisfiable(when({"all": [{"field": "hw.sm", "between": [80, 90]}, {"field": "hw.sm", "gt": 90}]}))
    assert satisfiable(when({"not": {"field": "hw.sm", "ge": 1}}))  # an absent field satisfies a negation
    assert satisfiable(when({"any": [{"field": "hw.sm", "gt": 90}, {"field": "hw.sm", "lt": 80}]}))
    assert satisfiable(when({"field": "model.name", "matches": "x"}))


def test_lint_reports_each_problem_kind(tmp_path):
    write_rules(tmp_path, [
        rule("dead", [{"advise": "x"}], {"all": [{"field": "hw.sm", "gt": 90}, {"field": "hw.sm", "lt": 80}]}),
        rule("x", [{"param": "spec.block_size", "range": [8, 16]}], {"field": "hw.arch", "eq": "hopper"}),
        rule("y", [{"param": "spec.block_size", "range": [2, 4]}], {"field": "workload.domain", "eq": "code"}),
        rule("bad", [{"param": "nope.param", "set": 1}]),
    ])
    write_rules(tmp_path, [rule("x", [{"advise": "dup"}])], "z.yaml")
    _, findings = lint_rules(tmp_path)
    assert kinds(findings) == ["contradiction", "error", "error", "never_fires"]
    text = "\n".join(f.message for f in findings)
    assert "unknown parameter 'nope.param'" in text and "duplicate rule id" in text
    assert "test.yaml" in text


def test_exclusive_conditions_do_not_contradict(tmp_path):
    write_rules(tmp_path, [
        rule("x", [{"param": "weights.dtype", "set": "fp8"}], {"field": "hw.sm", "ge": 89}),
        rule("y", [{"param": "weights.dtype", "set": "bf16"}], {"field": "hw.sm", "lt": 89}),
    ])
    assert lint_rules(tmp_path)[1] == []
