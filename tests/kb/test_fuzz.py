"""Fuzz the loader and the evaluator: never a traceback, never a partial sync."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kb.db import open_db
from kb.errors import RuleError
from kb.fields import flatten, profile_fields
from kb.loader import load_rules, parse_file
from kb.rules import OPS, Rule, evaluate
from kb.sync import sync_rules
from profiler.schema import Profile

FIELDS = sorted(profile_fields())
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=12))
json_like = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                         max_leaves=20)
leaf = st.builds(lambda f, op, v: {"field": f, op: v}, st.sampled_from(FIELDS + ["bogus.field"]),
                 st.sampled_from(list(OPS) + ["like"]), json_like)
condition = st.recursive(leaf, lambda kids: st.one_of(
    st.builds(lambda xs: {"all": xs}, st.lists(kids, max_size=3)),
    st.builds(lambda xs: {"any": xs}, st.lists(kids, max_size=3)),
    st.builds(lambda x: {"not": x}, kids)), max_leaves=6)
action = st.one_of(
    st.builds(lambda p, v: {"param": p, "set": v}, st.sampled_from(["spec.block_size", "spec.head", "x"]), json_like),
    st.builds(lambda lo, hi: {"param": "spec.block_size", "range": [lo, hi]}, st.integers(-3, 20), st.integers(-3, 20)),
    st.builds(lambda cs: {"param": "spec.head", "choices": cs}, st.lists(st.sampled_from(["none", "markov", "x"]))),
    st.builds(lambda t: {"advise": t}, st.text(max_size=20)),
    json_like,
)
rule_dict = st.fixed_dictionaries(
    {"id": st.one_of(st.text(max_size=10), st.just("fuzz.rule")), "title": st.text(max_size=20),
     "category": st.sampled_from(["speculative", "batching", "nope"]), "then": st.lists(action, max_size=3),
     "rationale": st.text(max_size=30), "references": st.lists(st.text(max_size=10), max_size=2)},
    optional={"when": condition, "priority": st.integers(-5, 2000), "tags": json_like})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_dict)
def test_random_rule_dicts_validate_or_fail_cleanly(d):
    try:
        Rule.model_validate(d)
    except ValidationError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=200), json_like.map(lambda x: yaml.safe_dump(x)),
                 st.lists(rule_dict, max_size=3).map(lambda x: yaml.safe_dump(x))))
def test_random_yaml_documents_never_raise(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("y") / "r.yaml"
    path.write_text(text)
    rules, errors = parse_file(path, "r.yaml")
    assert all(isinstance(e, RuleError) and "r.yaml" in str(e) for e in errors)


valid_rules = st.lists(rule_dict, max_size=4).map(
    lambda ds: [r for r in (_try(d) for d in ds) if r is not None])


def _try(d):
    try:
        return Rule.model_validate(d)
    except ValidationError:
        return None


profiles = st.fixed_dictionaries({}, optional={
    "model": st.fixed_dictionaries({}, optional={"params_total": st.floats(0, 1e12), "name": st.text(max_size=8),
                                                 "ops": st.dictionaries(st.sampled_from(["rope", "rmsnorm"]),
                                                                        st.integers(0, 9))}),
    "hw": st.fixed_dictionaries({}, optional={"arch": st.sampled_from(["hopper", "ampere"]),
                                              "sm": st.integers(0, 120), "fp8": st.booleans()}),
    "workload": st.fixed_dictionaries({}, optional={"domain": st.sampled_from(["chat", "code"]),
                                                    "concurrency": st.integers(1, 512)}),
}).map(Profile.model_validate)


@settings(max_examples=300, deadline=None)
@given(st.lists(rule_dict, max_size=6), profiles)
def test_evaluator_never_raises_on_valid_rules(ds, profile):
    flat = flatten(profile)
    for d in ds:
        r = _try(d)
        if r is not None:
            assert evaluate(r.when, flat) in (True, False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rule_dict, min_size=1, max_size=4))
def test_sync_is_never_partial(tmp_path_factory, ds):
    base: Path = tmp_path_factory.mktemp("s")
    good = base / "good"
    good.mkdir()
    (good / "a.yaml").write_text(yaml.safe_dump([{
        "id": "keep.me", "title": "Kept rule", "category": "speculative", "then": [{"advise": "x"}],
        "rationale": "Must survive a failed sync.", "references": ["here"]}]))
    db = open_db(f"sqlite:///{base / 'kb.sqlite'}")
    sync_rules(db, load_rules(good))
    mixed = base / "mixed"
    mixed.mkdir()
    (mixed / "b.yaml").write_text(yaml.safe_dump(ds))
    try:
        report = sync_rules(db, load_rules(mixed))
        assert "keep.me" in report.disabled  # a clean folder replaced the catalogue as a whole
    except RuleError:
        from kb.sync import enabled_rules

        assert [r.rule.id for r in enabled_rules(db)] == ["keep.me"]  # untouched
    db.dispose()
