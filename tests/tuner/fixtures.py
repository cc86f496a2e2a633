"""A Qwen3-8B-on-H100 profile and a small plan for the tuner tests (no profiler needed)."""

from __future__ import annotations

from kb.match import Plan
from profiler.schema import Profile

QWEN3_8B_H100 = {
    "model": {"name": "Qwen3-8B", "arch": "dense", "params_total": 8.19e9, "params_active": 8.19e9, "num_layers": 36,
              "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "vocab_size": 151936,
              "kv_bytes_per_token": {"bf16": 147456}, "max_context": 40960},
    "hw": {"name": "H100-SXM", "arch": "hopper", "sm": 90, "fp8": True, "bandwidth_gbs": 3350, "memory_gb": 80,
           "peak_tflops": {"bf16": 989, "fp8": 1979}, "interconnect": "nvlink", "count": 8},
    "workload": {"name": "chat", "domain": "chat", "concurrency": 16, "prompt_len": {"p50": 512, "p99": 2048},
                 "output_len": {"p50": 128, "p99": 512}, "slo": {"tpot_ms": 50, "ttft_ms": 2000}},
}

PLAN = {
    "space": {
        "spec.block_size": {"kind": "range", "low": 2, "high": 12, "type": "int", "rules": ["r.gamma"], "why": ""},
        "spec.scheduler": {"kind": "choices", "choices": ["verify_all", "prefix", "async_topk"], "type": "cat",
                           "rules": ["r.sched"], "why": ""},
        "batch.max_requests": {"kind": "range", "low": 4, "high": 32, "type": "int", "rules": ["r.batch"], "why": ""},
    },
    "fixed": {"spec.head": {"value": "markov", "rules": ["r.head"], "why": "set by r.head"}},
    "prefer": {"spec.block_size": {"value": 7, "rules": ["r.gamma"]}},
}


def profile() -> Profile:
    return Profile.model_validate(QWEN3_8B_H100)


def plan() -> Plan:
    return Plan.model_validate(PLAN)


def refused(capsys, *argv: str) -> str:  # noqa: ANN001 - pytest's capsys
    """cli.main(argv) exits 2 with one line on stderr and no traceback; returns that line."""
    import cli

    code = cli.main(list(argv))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
