"""The shipped rule catalogue: every rule fires on its fixture profile and stays silent on its counter-fixture.

The table tests/rules/firing.yaml names, for every rule id in rules/*.yaml, one fixture profile the rule must
fire on and one it must not fire on. Fixtures are full Profile JSON files under tests/rules/fixtures/.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from kb.fields import flatten
from kb.loader import LoadedRule, load_rules
from kb.rules import evaluate
from profiler.schema import Profile

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
RULES_DIR = HERE.parent.parent / "rules"


@cache
def catalogue() -> tuple[LoadedRule, ...]:
    return tuple(load_rules(RULES_DIR))


@cache
def fixtures() -> dict[str, dict[str, Any]]:
    """Fixture name -> flattened profile (each file must be a valid Profile)."""
    out = {}
    for path in sorted(FIXTURES.glob("*.json")):
        profile = Profile.model_validate(json.loads(path.read_text()))
        out[path.stem] = flatten(profile)
    return out


@cache
def table() -> dict[str, dict[str, str]]:
    return yaml.safe_load((HERE / "firing.yaml").read_text())["rules"]


def test_fixtures_are_valid_profiles_and_distinct() -> None:
    fx = fixtures()
    assert len(fx) >= 10
    blobs = {json.dumps(v, sort_keys=True) for v in fx.values()}
    assert len(blobs) == len(fx), "two fixture profiles are identical"


def test_every_rule_has_a_firing_entry_and_no_stale_entries() -> None:
    ids = {lr.id for lr in catalogue()}
    listed = set(table())
    assert not ids - listed, f"rules without a firing entry: {sorted(ids - listed)}"
    assert not listed - ids, f"firing entries for unknown rules: {sorted(listed - ids)}"


def test_firing_entries_name_existing_fixtures() -> None:
    names = set(fixtures())
    for rule_id, entry in table().items():
        assert set(entry) == {"fires", "silent"}, rule_id
        assert entry["fires"] in names, f"{rule_id}: unknown fixture {entry['fires']}"
        assert entry["silent"] in names, f"{rule_id}: unknown fixture {entry['silent']}"


@pytest.mark.parametrize("rule_id", sorted(table()))
def test_rule_fires_on_its_fixture_and_not_on_its_counter(rule_id: str) -> None:
    rules = {lr.id: lr.rule for lr in catalogue()}
    assert rule_id in rules
    entry = table()[rule_id]
    rule = rules[rule_id]
    assert evaluate(rule.when, fixtures()[entry["fires"]]), f"{rule_id} does not fire on {entry['fires']}"
    assert not evaluate(rule.when, fixtures()[entry["silent"]]), f"{rule_id} fires on {entry['silent']}"
