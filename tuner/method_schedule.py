"""The tuned draft length as a schedule over running batch sizes, for the bundle (issue 37, part 3).

A study tunes one draft length K at the workload's load. The engines can vary it with the batch (vLLM 0.33's
`num_speculative_tokens_per_batch_size`, SGLang 0.5.23's adaptive config), so the export carries a schedule built
from the tuned configuration with tuner/schedule.py, priced as each engine runs the method (its own per-round
constants, tuner/catalog/spec_costs.yaml):
- at and below the running batch the study simulated, K is the tuned K: what was tuned is what runs there;
- above it, the K that maximises committed tokens per second at each batch size (never longer than the tuned K,
  0 where speculation stops paying): load the study did not see only ever shortens the draft.
Only a simulated study gets one: a measured or live study exports the static K it measured.
"""

from __future__ import annotations

from typing import Any

from profiler.schema import Profile


def operating_batch(profile: Profile, params: dict[str, Any]) -> int:
    """The running requests at the workload's load: its closed-loop clients (or, under an arrival rate, the
    running-request cap), never more than that cap."""
    cap = int(params["batch.max_requests"])
    clients = profile.workload.concurrency if not profile.workload.request_rate else None
    return max(1, min(cap, int(clients or cap)))


def pin(schedule: list[list[int]], batch: int, k: int) -> list[list[int]]:
    """`schedule` with K = `k` on every batch size up to `batch` (the tuned point), its own K above; equal
    neighbours merged. `k` is the schedule's ceiling, so the result never grows with the batch."""
    pieces: list[list[int]] = []
    for lo, hi, kk in schedule:
        if hi <= batch:
            pieces.append([lo, hi, k])
        elif lo > batch:
            pieces.append([lo, hi, kk])
        else:
            pieces += [[lo, batch, k], [batch + 1, hi, kk]]
    out: list[list[int]] = []
    for lo, hi, kk in pieces:
        if out and out[-1][2] == kk and out[-1][1] + 1 == lo:
            out[-1][1] = hi
        else:
            out.append([lo, hi, kk])
    return out


def mean_context(profile: Profile) -> float:
    """The mean KV context of a decoding request: its prompt and half its output."""
    w = profile.workload
    prompt = (w.prompt_len.mean or w.prompt_len.p50 or 512) if w.prompt_len else 512
    output = (w.output_len.mean or w.output_len.p50 or 256) if w.output_len else 256
    return float(prompt) + float(output) / 2


def tuned_schedule(evaluator: Any, params: dict[str, Any], engine: str) -> list[list[int]] | None:
    """[[lo, hi, K], ...] from 1 to the running-request cap for `engine` (sglang | vllm), or None (speculation
    off, or not a simulated study)."""
    if getattr(evaluator, "mode", None) != "simulate" or not params.get("spec.enabled", True):
        return None
    k = int(params["spec.block_size"])
    if k <= 0:
        return None
    from tuner.methods import drafting_of, engine_costs
    from tuner.schedule import batch_schedule

    profile = evaluator.profile
    accept, draft = evaluator.drafting(params)
    drafting = drafting_of(params, profile, draft)
    costs = engine_costs(engine, profile.hw.arch)
    cap = int(params["batch.max_requests"])
    raw = batch_schedule(evaluator.perf(params), costs, drafting, accept, k, cap, mean_context(profile))
    return pin(raw, operating_batch(profile, params), k)


def tuned_schedules(evaluator: Any, params: dict[str, Any]) -> dict[str, list[list[int]] | None]:
    """The schedule per engine: {"sglang": ..., "vllm": ...}."""
    return {engine: tuned_schedule(evaluator, params, engine) for engine in ("sglang", "vllm")}
