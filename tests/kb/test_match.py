"""Matcher: fixed, space, prefer, advice; conflicts by priority then specificity; explanations."""

from __future__ import annotations

import pytest

from kb.errors import PlanConflict
from kb.match import match_profile
from kb.rules import Rule
from kb.sync import StoredRule
from profiler.schema import Profile
from tests.kb.helpers import rule

HOPPER = Profile.model_validate({"hw": {"arch": "hopper", "sm": 90}, "model": {"params_total": 8e9},
                                 "workload": {"domain": "code"}})
IS_HOPPER = {"field": "hw.arch", "eq": "hopper"}
IS_CODE = {"field": "workload.domain", "eq": "code"}


def plan_of(*rules, profile=HOPPER):
    return match_profile([StoredRule(Rule.model_validate(r), 1, "t.yaml", 1) for r in rules], profile)


def test_ranges_intersect_and_prefer_wins_inside():
    p = plan_of(rule("a", [{"param": "spec.block_size", "range": [4, 16], "prefer": 7}], IS_HOPPER),
                rule("b", [{"param": "spec.block_size", "range": [2, 8]}], IS_HOPPER))
    e = p.space["spec.block_size"]
    assert (e.low, e.high, e.type) == (4, 8, "int") and set(e.rules) == {"a", "b"}
    assert p.prefer["spec.block_size"].value == 7


def test_rules_that_do_not_fire_contribute_nothing():
    p = plan_of(rule("a", [{"param": "spec.block_size", "set": 3}], {"field": "hw.arch", "eq": "ampere"}))
    assert p.fixed == {} and p.fired == []


def test_empty_range_intersection_names_both_rules():
    with pytest.raises(PlanConflict, match=r"spec.block_size: b .* and a .*no feasible value"):
        plan_of(rule("a", [{"param": "spec.block_size", "range": [8, 16]}], IS_HOPPER),
                rule("b", [{"param": "spec.block_size", "range": [2, 4]}], IS_HOPPER))


def test_choices_intersect_and_forbid_removes():
    p = plan_of(rule("a", [{"param": "spec.scheduler", "choices": ["prefix", "threshold", "verify_all"]}]),
                rule("b", [{"param": "spec.scheduler", "forbid": ["verify_all"]}]))
    assert p.space["spec.scheduler"].choices == ["threshold", "prefix"]  # registry order


def test_forbid_alone_narrows_the_registry_domain():
    p = plan_of(rule("a", [{"param": "kv.dtype", "forbid": ["fp8_e4m3", "fp8_e5m2"]}]))
    assert p.space["kv.dtype"].choices == ["auto", "bf16", "fp16"]


def test_single_value_left_becomes_fixed():
    p = plan_of(rule("a", [{"param": "spec.head", "choices": ["markov", "rnn"]}]),
                rule("b", [{"param": "spec.head", "choices": ["rnn", "none"]}]))
    assert p.fixed["spec.head"].value == "rnn" and "spec.head" not in p.space
    assert any("leave only 'rnn'" in r for r in p.resolutions)


def test_set_by_priority_then_specificity():
    low = rule("low", [{"param": "weights.dtype", "set": "bf16"}], IS_HOPPER, priority=10)
    high = rule("high", [{"param": "weights.dtype", "set": "fp8"}], IS_HOPPER, priority=90)
    assert plan_of(low, high).fixed["weights.dtype"].value == "fp8"
    general = rule("general", [{"param": "weights.dtype", "set": "bf16"}], IS_HOPPER)
    specific = rule("specific", [{"param": "weights.dtype", "set": "fp8"}], {"all": [IS_HOPPER, IS_CODE]})
    p = plan_of(general, specific)
    assert p.fixed["weights.dtype"].value == "fp8"
    assert any("specific sets 'fp8' over general" in r for r in p.resolutions)


def test_equal_rank_sets_conflict():
    with pytest.raises(PlanConflict, match="give one a higher priority"):
        plan_of(rule("a", [{"param": "weights.dtype", "set": "bf16"}], IS_HOPPER),
                rule("b", [{"param": "weights.dtype", "set": "fp8"}], IS_HOPPER))


def test_set_against_constraints():
    rng = rule("rng", [{"param": "spec.block_size", "range": [4, 8]}], IS_HOPPER, priority=10)
    st = rule("st", [{"param": "spec.block_size", "set": 12}], IS_HOPPER, priority=90)
    p = plan_of(rng, st)
    assert p.fixed["spec.block_size"].value == 12 and "spec.block_size" not in p.space
    assert any("overriding rng" in r for r in p.resolutions)
    with pytest.raises(PlanConflict, match="outside"):
        plan_of(dict(rng, priority=90), dict(st, priority=10))


def test_prefer_outside_space_is_ignored_and_explained():
    p = plan_of(rule("a", [{"param": "spec.block_size", "range": [2, 4]}]),
                rule("b", [{"param": "spec.block_size", "prefer": 7}]))
    assert "spec.block_size" not in p.prefer
    assert any("lies outside" in r for r in p.resolutions)


def test_advice_and_fired_rules_recorded():
    p = plan_of(rule("a", [{"advise": "Profile SPS on the target GPU.", "param": "spec.scheduler"}]))
    assert p.advice[0].text.startswith("Profile") and p.advice[0].rules == ["a"]
    assert p.rule_refs() == [{"id": "a", "version": 1}]
