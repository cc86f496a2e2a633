"""Small builders for rule files used by the knowledge-base tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def rule(rid: str, then: list[dict[str, Any]], when: Any = None, priority: int = 50,
         category: str = "speculative") -> dict[str, Any]:
    r: dict[str, Any] = {"id": rid, "title": f"Test rule {rid}", "category": category, "then": then,
                         "priority": priority, "rationale": "A rule written for a test.",
                         "references": ["tests/kb (this project)"]}
    if when is not None:
        r["when"] = when
    return r


def write_rules(folder: Path, rules: list[dict[str, Any]], name: str = "test.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump(rules, sort_keys=False))
    return folder
