"""The bounded readers under every user-file command (dspark_core/userfiles.py, jsonl.py, safe_yaml.py) at their
edges, with caps small enough to reach: the line cap is exact, the depth scan equals the real nesting on any JSON
and never recurses, YAML aliases / expanded size / expanded depth / cycles are refused at a line, and libyaml and
the pure-Python parser agree. The commands themselves are replayed in tests/kb/test_hostile_rule_files.py,
tests/live/test_hostile_inputs.py and tests/profiler/test_hostile_workload_files.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark_core.safe_yaml as safe_yaml
from dspark_core.jsonl import json_depth, read_jsonl
from dspark_core.userfiles import UserFileError, iter_lines, read_capped

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(blacklist_categories=["Cs"]) | st.sampled_from('[]{}"\\'), max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3), max_leaves=30)


def _depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_depth_scan_is_exact(value: Any, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert json_depth(raw) == _depth(value)


def test_depth_scan_of_a_million_brackets_is_linear() -> None:
    assert json_depth(b"[" * 1_000_000) == 1_000_000  # no recursion, no quadratic string matching
    assert json_depth(b'"' + b"\\\"[" * 500_000) == 0  # an unterminated string: its brackets are inside it


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b""])
def test_line_cap_is_exact(tmp_path: Path, ending: bytes) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"a" * 10 + b"\n" + b"b" * 16 + ending)
    assert [n for n, _ in iter_lines(path, line_cap=16)] == [1, 2]
    with pytest.raises(UserFileError, match=r"f.jsonl:2: line longer than"):
        list(iter_lines(path, line_cap=15))


def test_file_cap_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n  \r\n[1, [2]]\n')
    assert list(read_jsonl(path)) == [(1, {"prompt": "a"}), (4, [1, [2]])]
    with pytest.raises(UserFileError, match=r"f.jsonl:4: JSON nested 2 levels deep, over the cap of 1"):
        list(read_jsonl(path, depth=1))
    with pytest.raises(UserFileError, match=r"is 30 bytes|over the .* cap for a JSONL file"):
        list(read_jsonl(path, file_cap=20))
    with pytest.raises(UserFileError, match="over the .* cap for a rule file"):
        read_capped(path, 20, "a rule file")


def _strict(name: str, pure_python: bool, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202 - a module
    """dspark_core.safe_yaml as imported here, or a fresh copy built on PyYAML's pure-Python parser."""
    if not pure_python:
        return safe_yaml
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    spec = importlib.util.spec_from_file_location(f"_safe_yaml_{name}", safe_yaml.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.StrictLoader.__mro__[1] is yaml.SafeLoader
    return module


LAUGHS = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: &c [*b, *b, *b]\nd: [*c, *c, *c]\n"  # 3 + 9 + 27 + 81 leaves
CASES = [  # (document, caps, line: what its error says, or None: accepted)
    (LAUGHS, {"node_cap": 100}, "4: YAML of more than 100 values once aliases are expanded"),
    (LAUGHS, {"node_cap": 200}, None),
    (LAUGHS, {"alias_cap": 5}, "3: more than 5 YAML aliases"),
    ("a: &a [[[1]]]\nb: [[*a]]\n", {"depth_cap": 5}, "1: YAML nested more than 5 levels deep once aliases"),
    ("a: &a [[[1]]]\nb: [*a]\n", {"depth_cap": 5}, None),
    ("- " * 70 + "x\n", {}, "1: YAML nested more than 64 levels deep"),
    ("a: &a [1, *a]\n", {}, "1: a YAML alias refers to a collection that contains it"),
    ("x: 1\ny: 2\nx: 3\n", {}, "3: malformed YAML: duplicate key 'x'"),
    ("x: [14.0e9, 1e-3, 2001-12-14]\n", {}, None),
    ("x: .nan\n", {}, "1: '.nan' is not a finite number"),
    ("x: 18446744073709551616\n", {}, "1: an integer of 65 bits, past 64"),
    ('x: "\\0"\n', {}, "1: a string holding a NUL character"),
    ("x: !!set {a}\n", {}, "1: tag:yaml.org,2002:set values are not allowed"),
]


@pytest.mark.parametrize("pure_python", [False, True], ids=["libyaml", "python"])
def test_yaml_caps_and_values(monkeypatch: pytest.MonkeyPatch, pure_python: bool) -> None:
    mod = _strict("caps", pure_python, monkeypatch)
    for text, caps, says in CASES:
        if says is None:
            value, root = mod.load_yaml(text, "r.yaml", **caps)
            assert root is not None and value is not None
            continue
        with pytest.raises(UserFileError) as e:
            mod.load_yaml(text, "r.yaml", **caps)
        assert str(e.value).startswith(f"r.yaml:{says}"), (text[:40], str(e.value))
    assert mod.load_yaml("x: [14.0e9, 2001-12-14]\n", "r.yaml")[0] == {"x": [14e9, "2001-12-14"]}
