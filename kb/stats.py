"""Counts over the rule catalogue, each of rules (a rule counts once per group, however many actions it has): by
category, by action kind, by parameter, by kind of source, and by what the conditions read (roofline facts,
memory-fit facts, GPU identity)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kb.rules import Rule, leaves

# kind of source -> pattern on a reference string (first match wins, order matters)
SOURCE_KINDS: tuple[tuple[str, str], ...] = (
    ("derived", r"^derived:"),
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
# what a condition reads: the hardware's ceilings and the roofline derived from them, what fits in memory, or
# which GPU it is
ROOFLINE = re.compile(r"^(derived\.(decode_bound|ridge_batch|verify_budget|arith_intensity|ridge_intensity|"
                      r"decode_step_ms)|hw\.(bandwidth_gbs|peak_tflops\..*|measured\..*))$")
MEMORY_FIT = re.compile(r"^derived\.(min_tp_.*|weights_fit_.*|kv_capacity_tokens)$")
GPU_IDENTITY = re.compile(r"^hw\.(name|arch|sm|vendor)$")


def source_kind(reference: str) -> str:
    low = reference.lower()
    for kind, pattern in SOURCE_KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def _reads(rule: Rule, pattern: re.Pattern[str]) -> bool:
    return any(pattern.match(leaf.field) for leaf in leaves(rule.when))


def rule_stats(rules: list[Rule]) -> dict[str, Any]:
    n = len(rules)
    by_action = Counter(kind for r in rules for kind in {a.kind for a in r.then})
    by_param = Counter(p for r in rules for p in {a.param for a in r.then if a.param})
    by_source = Counter(kind for r in rules for kind in {source_kind(ref) for ref in r.references})
    reads = {name: sum(_reads(r, pat) for r in rules) for name, pat in
             (("roofline", ROOFLINE), ("memory_fit", MEMORY_FIT), ("gpu_identity", GPU_IDENTITY))}
    return {
        "total": n,
        "by_category": dict(Counter(r.category for r in rules).most_common()),
        "by_action": dict(by_action.most_common()),
        "by_param": dict(by_param.most_common()),
        "by_source": dict(by_source.most_common()),
        "conditions_read": reads,
        "roofline_share": round(reads["roofline"] / n, 3) if n else 0.0,
        "references": sum(len(r.references) for r in rules),
    }
