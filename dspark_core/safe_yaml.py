"""Strict, bounded YAML for user files: duplicate keys refused, YAML 1.2 floats, JSON's value types only (finite
numbers, 64-bit integers, text without NUL or lone surrogates: what PostgreSQL's JSON and text hold; timestamps stay
text; !!binary / !!set refused), and nesting, aliases and the size after alias expansion capped before anything is
constructed.

Why: PyYAML composes recursively (100k nested `[` is a RecursionError traceback), keeps the last of two equal
keys silently, and expands nothing itself but hands a "billion laughs" document (9 aliases of 9 aliases ...) to
code that walks it: validation and error messages then run for minutes. Here a first pass over the parser's
events (iterative, libyaml when present) bounds depth and alias uses, the composed node graph is measured with
every alias expanded (memoised, so measuring is linear in the file), and only then is it constructed.

Caps: YAML_DEPTH nesting levels, YAML_ALIASES alias uses per document, YAML_NODES nodes after expansion.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import yaml

from dspark_core.userfiles import UserFileError

YAML_DEPTH = 64  # a rule is ~8 levels deep (rule > when > all > [..] > leaf > value)
YAML_ALIASES = 128  # alias (*name) uses in one document
YAML_NODES = 250_000  # nodes with every alias expanded (a 1 MiB rule file holds ~150k without aliases)
MAX_INT_BITS = 64  # integers JSON readers agree on (Python's str() of one stops at 4300 digits)

_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: ~5x faster, same events and nodes


class StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last silently) and reads YAML 1.2
    floats such as 14.0e9 (PyYAML's 1.1 resolver reads them as strings)."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "unhashable mapping key", key_node.start_mark) from None
        if dup:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class ValueRefused(yaml.constructor.ConstructorError):
    """A well-formed value these files may not hold (the message says what to write instead)."""


def _scalar(construct: Callable[[Any, yaml.ScalarNode], Any]) -> Callable[[Any, yaml.ScalarNode], Any]:
    """A scalar constructor whose failures (an int of 5000 digits, `!!int x`) are YAML errors at the node's line,
    and whose floats are finite: these files end up as JSON, which has no NaN or infinity."""
    def run(loader: Any, node: yaml.ScalarNode) -> Any:
        try:
            value = construct(loader, node)
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueRefused(None, None, f"{str(node.value)[:40]!r} is not a valid {node.tag.rsplit(':', 1)[-1]} "
                                           f"({str(e)[:60]}); write a number", node.start_mark) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueRefused(None, None, f"{str(node.value)[:40]!r} is not a finite number (JSON, where this is "
                                           "stored, has no NaN or infinity); write a finite number", node.start_mark)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ValueRefused(None, None, f"an integer of {value.bit_length()} bits, past {MAX_INT_BITS}; write "
                                           "a smaller number", node.start_mark)
        return value
    return run


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL (no PostgreSQL text holds it), lone surrogates (not UTF-8)


def _text(loader: Any, node: yaml.ScalarNode) -> str:
    """A string PostgreSQL and UTF-8 can hold: no NUL (the "\\0" escape), no lone surrogate ("\\ud800")."""
    value = yaml.constructor.SafeConstructor.construct_yaml_str(loader, node)
    if _UNSTORABLE.search(value):
        raise ValueRefused(None, None, "a string holding a NUL character or a lone UTF-16 surrogate (\\0, "
                                       "\\ud800), which cannot be stored as text; remove it", node.start_mark)
    return value


def _as_written(loader: Any, node: yaml.ScalarNode) -> str:
    """A timestamp stays the text it was written as (YAML 1.2 has no timestamp type; JSON has no date)."""
    return str(node.value)


def _refused(loader: Any, node: yaml.Node) -> Any:
    raise ValueRefused(None, None, f"{node.tag} values are not allowed here; use mappings, lists, strings, "
                                   "numbers, booleans and null", node.start_mark)


StrictLoader.add_constructor("tag:yaml.org,2002:int", _scalar(yaml.constructor.SafeConstructor.construct_yaml_int))
StrictLoader.add_constructor("tag:yaml.org,2002:float",
                             _scalar(yaml.constructor.SafeConstructor.construct_yaml_float))
StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_written)
StrictLoader.add_constructor("tag:yaml.org,2002:str", _text)
for _tag in ("binary", "set", "omap", "pairs"):
    StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refused)


def _line(mark: Any) -> int | None:
    return mark.line + 1 if mark is not None else None


def _check_events(text: str, path: str | os.PathLike[str], depth_cap: int, alias_cap: int) -> None:
    """Nesting depth and alias uses, from the parser's event stream (no recursion, stops at the first excess)."""
    depth = aliases = 0
    for ev in yaml.parse(text, Loader=StrictLoader):
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > depth_cap:
                raise UserFileError(path, f"YAML nested more than {depth_cap} levels deep; flatten it",
                                    _line(ev.start_mark))
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(ev, yaml.AliasEvent):
            aliases += 1
            if aliases > alias_cap:
                raise UserFileError(path, f"more than {alias_cap} YAML aliases (*name); write the values out",
                                    _line(ev.start_mark))


def _measure(root: yaml.Node, path: str | os.PathLike[str], depth_cap: int, node_cap: int) -> None:
    """Refuse a node graph whose alias-expanded size or nesting is over the caps, or that contains itself. Memoised
    per node, so a billion laughs is measured in as many steps as it has lines; recursion is bounded by
    `depth_cap` (checked before descending). Depth counts collections, as the event pass does."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded collection height)
    active: set[int] = set()

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        if isinstance(node, yaml.ScalarNode):
            return 1, 0
        key = id(node)
        if key in active:
            raise UserFileError(path, "a YAML alias refers to a collection that contains it; remove the cycle",
                                _line(node.start_mark))
        known = sizes.get(key)
        if known is None:
            if depth > depth_cap:
                raise UserFileError(path, f"YAML nested more than {depth_cap} levels deep once aliases are "
                                          "expanded; flatten it", _line(node.start_mark))
            active.add(key)
            kids = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
            size, height = 1, 1
            for kid in kids:
                s, h = walk(kid, depth + 1)
                size, height = size + s, max(height, h + 1)
                if size > node_cap:
                    break
            active.discard(key)
            known = sizes[key] = (size, height)
        elif depth + known[1] - 1 > depth_cap:
            raise UserFileError(path, f"YAML nested more than {depth_cap} levels deep once aliases are expanded; "
                                      "flatten it", _line(node.start_mark))
        if known[0] > node_cap:
            raise UserFileError(path, f"YAML of more than {node_cap} values once aliases are expanded (a \"billion "
                                      "laughs\"?); write the values out or split the file", _line(node.start_mark))
        return known

    walk(root, 1)


def load_yaml(text: str, path: str | os.PathLike[str], depth_cap: int = YAML_DEPTH, alias_cap: int = YAML_ALIASES,
              node_cap: int = YAML_NODES) -> tuple[Any, yaml.Node | None]:
    """(value, root node: its marks give each item's line) of one YAML document, strict and bounded; any problem is
    one UserFileError `FILE:LINE: what; how to fix`. An empty document is (None, None)."""
    try:
        _check_events(text, path, depth_cap, alias_cap)
        loader = StrictLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None, None
            _measure(root, path, depth_cap, node_cap)
            return loader.construct_document(root), root
        finally:
            loader.dispose()
    except ValueRefused as e:
        raise UserFileError(path, str(e.problem), _line(e.problem_mark)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if "nesting depth" in problem:  # libyaml's scanner looks ahead past our cap to its own (1000)
            problem = f"YAML nested more than {depth_cap} levels deep"
            raise UserFileError(path, f"{problem}; flatten it", _line(mark)) from None
        raise UserFileError(path, f"malformed YAML: {problem}; fix the syntax", _line(mark)) from None
