"""A Prometheus /metrics page of ours, vLLM's or SGLang's, as one engine-neutral sample (kb.deployments.Sample).

Names: ours and vLLM's
are vLLM 0.33's (`vllm:spec_decode_num_accepted_tokens_per_pos` gives acceptance per position); SGLang 0.5.23
exports `sglang:*` counters and histograms, and speculative decoding only as gauges of its recent batches
(`sglang:spec_accept_length` = tau, `sglang:spec_accept_rate`), so a SGLang window has tau but no positions."""

from __future__ import annotations

from typing import Any

from kb.deployments import HIST, Kind, Sample

MAX_POSITIONS = 64  # draft positions kept per sample (blocks are <= 16 in practice; a label of 10**9 is not one)

NAMES: dict[str, dict[str, str]] = {  # sample field -> metric family name (without _total), per server family
    "vllm": {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
             "prompt_tokens": "vllm:prompt_tokens", "generation_tokens": "vllm:generation_tokens",
             "finished": "vllm:request_success", "rejected": "vllm:admission_rejections",
             "drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
             "accepted": "vllm:spec_decode_num_accepted_tokens",
             "accepted_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
             "ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
             "e2e": "vllm:e2e_request_latency_seconds"},
    "sglang": {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
               "prompt_tokens": "sglang:prompt_tokens", "generation_tokens": "sglang:generation_tokens",
               "finished": "sglang:num_requests", "accept_length": "sglang:spec_accept_length",
               "accept_rate": "sglang:spec_accept_rate", "cap_length": "sglang:spec_cap_length",
               "ttft": "sglang:time_to_first_token_seconds", "itl": "sglang:inter_token_latency_seconds",
               "e2e": "sglang:e2e_request_latency_seconds"},
}


def _bound(le: str | None) -> bool:
    """Whether a histogram bucket's `le` label is a bound: a number or +Inf (not NaN, not text)."""
    try:
        return le is not None and float(le) == float(le)
    except ValueError:
        return False


def parse(text: str, t: float) -> Sample:
    """A /metrics page -> Sample; which family it is comes from its names. NaN / infinite values are dropped and
    counted by Sample itself (kb.deployments); a malformed page is a ValueError."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    pos: dict[int, float] = {}
    tried: dict[int, float] = {}
    engine: dict[str, str] = {}
    hist: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if s.name.endswith("_bucket"):
                le = s.labels.get("le")
                if _bound(le):  # a bucket without a numeric bound is not one
                    h = hist.setdefault(s.name[: -len("_bucket")], {})
                    h[le] = h.get(le, 0.0) + s.value
                continue
            base = s.name.removesuffix("_total")
            if base == "dspark:engine_info":
                engine = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            if base.endswith("_per_pos"):
                p, table = int(s.labels.get("position", -1)), pos if "accepted" in base else tried
                if 0 <= p < MAX_POSITIONS:
                    table[p] = table.get(p, 0.0) + s.value
            values[base] = values.get(base, 0.0) + s.value
    prefixes = {k.split(":", 1)[0] for k in values}
    kind: Kind = "dspark" if "dspark" in prefixes else "vllm" if "vllm" in prefixes else "sglang"
    names = NAMES["sglang" if kind == "sglang" else "vllm"]
    out: dict[str, Any] = {"t": t, "kind": kind, "engine": engine}
    for field, name in names.items():
        if field in HIST:
            out[field] = hist.get(name, {})
        elif field == "accepted_pos":
            out[field] = [pos.get(p, 0.0) for p in range(max(pos) + 1)] if pos else []
        elif name in values:
            out[field] = values[name]
    if tried:
        out["verified_pos"] = [tried.get(p, 0.0) for p in range(max(tried) + 1)]
    return Sample.model_validate(out)
