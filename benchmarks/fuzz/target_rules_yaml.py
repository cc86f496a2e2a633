"""Fuzz target `rules_yaml`: the rule-file reader (`rules lint`, `kb sync`), fed arbitrary bytes as a rule file.

One input is written as `rules/a.yaml` and read the way the commands read a folder: `kb.loader.load_all` (regular
file and byte caps, then the strict bounded YAML of dspark_core/safe_yaml.py, then rule validation) and
`kb.lint.lint_rules`; and the bounded YAML loader alone with tiny caps (depth 6, 3 aliases, 100 nodes), so its
refusals are exercised at the sizes libFuzzer builds. Problems must come back as one-line RuleErrors naming the
file (or, for the loader alone, UserFileError); anything escaping is a bug, and so is an accepted rule that does
not survive the database: its stored JSON must be strict JSON and validate back to the same rule.
"""

from __future__ import annotations

import json
from pathlib import Path

from scratch import scratch_dir, write

from dspark_core.safe_yaml import load_yaml
from dspark_core.userfiles import UserFileError
from kb.errors import RuleError
from kb.lint import lint_rules
from kb.loader import load_all
from kb.rules import Rule

ROOT = Path(__file__).resolve().parents[2]
MAX_LEN = 4096


def _seeds() -> list[bytes]:
    """The first rules of each shipped file (whole rules, within MAX_LEN), and small anchors / merges / flows."""
    out = []
    for path in sorted((ROOT / "rules").glob("*.yaml")):
        text = path.read_text()
        starts = [i for i in range(len(text)) if text.startswith("\n- id:", i)]
        cut = max([i for i in starts if i < MAX_LEN] or [0])
        if cut:
            out.append(text[:cut + 1].encode())
    out += [b"- id: a.b\n  title: Anchored\n  category: speculative\n  when: &w {field: hw.arch, eq: hopper}\n"
            b"  then: [{param: spec.block_size, range: [2, 8], prefer: 4}]\n  rationale: An anchored condition.\n"
            b"  references: [here]\n- id: a.c\n  title: Aliased\n  category: speculative\n  when: {not: *w}\n"
            b"  then: [{advise: x}]\n  rationale: The condition again.\n  references: [here]\n",
            b"base: &b {x: 1}\nuse: {<<: *b, y: [1, 2.5e3, .5, 0x1f, 2001-12-14, null, ~, yes]}\n",
            b"- {id: f, title: Flow rule, category: moe, when: {any: [{field: model.moe, eq: true}]}, "
            b"then: [{param: parallel.ep, choices: [1, 2]}], rationale: Flow style all along., references: [r]}\n"]
    return out


SEEDS: list[bytes] = _seeds()
DICTIONARY: list[bytes] = [b"- id: ", b"title: ", b"category: speculative", b"when: ", b"then: ", b"rationale: ",
                           b"references: ", b"priority: ", b"{field: hw.arch, eq: hopper}", b"all: ", b"any: ",
                           b"not: ", b"param: spec.block_size", b"range: ", b"set: ", b"prefer: ", b"advise: ",
                           b"&a ", b"*a", b"<<: ", b"!!binary ", b"!!set ", b".nan", b".inf", b"1e999", b'"\\0"',
                           b'"\\ud800"', b"0x" + b"f" * 20, b"? ", b"---\n", b"[[[[", b"{", b"}", b"\t", b"#"]


def fuzz_one(data: bytes) -> None:
    """The rule loader and lint on `data` as a rule file; accepted rules must survive a round trip as JSON."""
    write("a.yaml", data, folder="rules")
    folder = scratch_dir() / "rules"
    rules, errors = load_all(folder)
    for e in errors:
        assert isinstance(e, RuleError) and str(e).startswith("a.yaml") and "\n" not in str(e), str(e)[:300]
    for lr in rules:
        body = lr.rule.to_json()
        json.dumps(body, allow_nan=False)
        assert Rule.model_validate(body).content_hash() == lr.rule.content_hash(), body
    lint_rules(folder)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    try:
        load_yaml(text, "a.yaml", depth_cap=6, alias_cap=3, node_cap=100)
    except UserFileError:
        pass
