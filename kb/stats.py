"""Counts over the rule catalogue: by category, by action kind, by kind of source."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kb.rules import Rule

# kind of source -> pattern on a reference string (first match wins, order matters)
SOURCE_KINDS: tuple[tuple[str, str], ...] = (
    ("measurement", r"\bbenchmarks/|measured|this project"),
    ("sglang", r"sglang"),
    ("vllm", r"vllm"),
    ("tensorrt-llm", r"tensorrt|trt-?llm"),
    ("aiconfigurator", r"aiconfigurator"),
    ("deepspec/dspark", r"dspark|deepspec"),
    ("paper", r"arxiv|paper|§|et al\."),
    ("vendor docs", r"nvidia|amd|rocm|cuda|datasheet|docs\."),
    ("triton", r"triton"),
)


def source_kind(reference: str) -> str:
    low = reference.lower()
    for kind, pattern in SOURCE_KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def rule_stats(rules: list[Rule]) -> dict[str, Any]:
    by_category = Counter(r.category for r in rules)
    by_action = Counter(a.kind for r in rules for a in r.then)
    by_source = Counter(source_kind(ref) for r in rules for ref in r.references)
    return {
        "total": len(rules),
        "by_category": dict(by_category.most_common()),
        "by_action": dict(by_action.most_common()),
        "by_source": dict(by_source.most_common()),
        "references": sum(len(r.references) for r in rules),
    }
