"""Read rules/*.yaml into validated Rule objects, each with its file and line."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kb.errors import RuleError
from kb.rules import Rule

DEFAULT_RULES_DIR = Path(__file__).resolve().parent.parent / "rules"


@dataclass(frozen=True)
class LoadedRule:
    rule: Rule
    file: str  # path relative to the rules folder
    line: int  # 1-based line of the rule's first key

    @property
    def id(self) -> str:
        return self.rule.id


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
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


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.2 floats such as 14.0e9 or 1e-3 (PyYAML's 1.1 resolver reads them as strings).
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def rules_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The rules folder: the argument, else $DSPARK_RULES, else the shipped rules/."""
    chosen = Path(path or os.environ.get("DSPARK_RULES") or DEFAULT_RULES_DIR)
    if not chosen.is_dir():
        raise RuleError(f"rules folder {chosen} does not exist; pass --rules DIR or set DSPARK_RULES")
    return chosen


def _explain(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and p in ("leaf", "all", "any",
                                                                                      "not")))
    msg = first["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def parse_file(path: Path, rel: str) -> tuple[list[LoadedRule], list[RuleError]]:
    """Rules of one file and the errors found in it (all of them, not only the first)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return [], [RuleError(f"cannot read: {e}", rel)]
    try:
        root = yaml.compose(text, Loader=_UniqueKeyLoader)
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        return [], [RuleError(f"malformed YAML: {problem}; fix the syntax", rel, mark.line + 1 if mark else None)]
    if data is None:
        return [], []
    if not isinstance(data, list) or not isinstance(root, yaml.SequenceNode):
        return [], [RuleError("a rule file is a YAML list of rules (each item starts with '- id: ...')", rel, 1)]
    loaded, errors = [], []
    for item, node in zip(data, root.value, strict=True):
        line = node.start_mark.line + 1
        rid = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
        if not isinstance(item, dict):
            errors.append(RuleError("each rule is a mapping with id, title, category, when, then, ...", rel, line))
            continue
        try:
            loaded.append(LoadedRule(Rule.model_validate(item), rel, line))
        except ValidationError as e:
            errors.append(RuleError(_explain(e), rel, line, rid))
        except (RecursionError, TypeError, ValueError) as e:
            errors.append(RuleError(f"invalid rule: {e}", rel, line, rid))
    return loaded, errors


def load_all(directory: Path) -> tuple[list[LoadedRule], list[RuleError]]:
    """Every rule under ``directory`` plus every error, duplicate ids included."""
    loaded: list[LoadedRule] = []
    errors: list[RuleError] = []
    for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
        rules, errs = parse_file(path, path.name)
        loaded += rules
        errors += errs
    first: dict[str, LoadedRule] = {}
    unique: list[LoadedRule] = []
    for lr in loaded:
        if lr.id in first:
            f = first[lr.id]
            errors.append(RuleError(f"duplicate rule id (first defined at {f.file}:{f.line}); rename one",
                                    lr.file, lr.line, lr.id))
        else:
            first[lr.id] = lr
            unique.append(lr)
    return unique, errors


def load_rules(directory: str | os.PathLike[str] | None = None) -> list[LoadedRule]:
    """Valid rules of the folder, or the first error raised as a one-line RuleError."""
    folder = rules_dir(directory)
    rules, errors = load_all(folder)
    if errors:
        e = errors[0]
        more = f" (and {len(errors) - 1} more; run 'dspark rules lint')" if len(errors) > 1 else ""
        raise RuleError(f"{e.reason}{more}", str(folder / e.file) if e.file else None, e.line, e.rule_id)
    return rules
