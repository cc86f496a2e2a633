"""Read rules/*.yaml into validated Rule objects, each with its file and line."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from dspark_core.safe_yaml import load_yaml
from dspark_core.userfiles import RULE_FILE_BYTES, RULES_DIR_BYTES, UserFileError, mib, read_capped
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


MAX_RULE_FILES = 256  # *.yaml / *.yml files in one rules folder (the shipped catalogue has 11)
MAX_RULES = 2000  # rules in one folder (the shipped catalogue has ~200; lint compares rules pairwise)
MAX_MESSAGE = 300  # characters of a rule's error message (a value quoted in it may be huge)


def rules_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The rules folder: the argument, else $DSPARK_RULES, else the shipped rules/."""
    chosen = Path(path or os.environ.get("DSPARK_RULES") or DEFAULT_RULES_DIR)
    if not chosen.is_dir():
        what = "is not a folder" if chosen.exists() else "does not exist"
        raise RuleError(f"rules folder {chosen} {what}; pass --rules DIR or set DSPARK_RULES")
    return chosen


def _short(msg: str) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= MAX_MESSAGE else msg[: MAX_MESSAGE - 3] + "..."


def _explain(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and p in ("leaf", "all", "any",
                                                                                      "not")))
    msg = _short(first["msg"].removeprefix("Value error, "))
    return f"{loc}: {msg}" if loc else msg


def parse_file(path: Path, rel: str, max_rules: int = MAX_RULES) -> tuple[list[LoadedRule], list[RuleError]]:
    """Rules of one file and the errors found in it (all of them, not only the first). The file is read bounded
    (a regular file of at most 1 MiB; YAML nesting, aliases and expanded size capped: dspark_core/safe_yaml.py);
    one over a cap is one error, its rules unread. A file of more than `max_rules` rules is one error too."""
    try:
        text = read_capped(path, RULE_FILE_BYTES, "a rule file").decode("utf-8")
        data, root = load_yaml(text, rel)
    except UnicodeDecodeError as e:
        return [], [RuleError(f"not UTF-8 text (byte {e.start + 1}); save the file as UTF-8", rel)]
    except UserFileError as e:
        return [], [RuleError(e.reason, rel, e.line)]
    if data is None:
        return [], []
    if not isinstance(data, list) or not isinstance(root, yaml.SequenceNode):
        return [], [RuleError("a rule file is a YAML list of rules (each item starts with '- id: ...')", rel, 1)]
    if len(data) > max_rules:
        return [], [RuleError(f"{len(data)} rules here take the folder past its cap of {MAX_RULES} rules; split the "
                              "catalogue into folders", rel, 1)]
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
            errors.append(RuleError(_short(f"invalid rule: {e}"), rel, line, rid))
    return loaded, errors


def rule_files(directory: Path) -> tuple[list[Path], list[RuleError]]:
    """The folder's *.yaml then *.yml entries (sorted) that are regular files (symlinks followed), and one error per
    entry that is not (a FIFO, device or folder named *.yaml is never opened). More than MAX_RULE_FILES files, or
    more than RULES_DIR_BYTES of them together, is one RuleError for the whole folder, raised before any is read."""
    entries: list[os.DirEntry[str]] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.endswith((".yaml", ".yml")):
                    entries.append(entry)
                    if len(entries) > MAX_RULE_FILES:
                        raise RuleError(f"rules folder {directory} has more than {MAX_RULE_FILES} rule files; keep "
                                        "one file per category")
    except OSError as e:
        raise RuleError(f"rules folder {directory}: cannot list it ({e.strerror}); check its permissions") from None
    files, errors, total = [], [], 0
    for entry in sorted(entries, key=lambda e: (e.name.endswith(".yml"), e.name)):
        try:
            st = os.stat(entry.path)
        except OSError as e:
            errors.append(RuleError(f"cannot read ({e.strerror}); fix or remove it", entry.name))
            continue
        if not stat.S_ISREG(st.st_mode):
            errors.append(RuleError("not a regular file (a folder, FIFO or device named like a rule file); remove "
                                    "or rename it", entry.name))
            continue
        total += st.st_size
        files.append(Path(entry.path))
    if total > RULES_DIR_BYTES:
        raise RuleError(f"rules folder {directory} holds {mib(total)} of rule files, over the {mib(RULES_DIR_BYTES)} "
                        "cap; keep only rule files there (the shipped catalogue is ~0.2 MiB)")
    return files, errors


def load_all(directory: Path) -> tuple[list[LoadedRule], list[RuleError]]:
    """Every rule under ``directory`` plus every error, duplicate ids included; a folder over the file or byte caps
    is one RuleError, a file that takes it past MAX_RULES rules is one error."""
    files, errors = rule_files(directory)
    loaded: list[LoadedRule] = []
    for path in files:
        rules, errs = parse_file(path, path.name, MAX_RULES - len(loaded))
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
