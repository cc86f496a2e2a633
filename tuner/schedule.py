"""The draft length as a schedule over batch sizes: at each running batch size, the K that maximises committed
tokens per second, B x tau(K) / round(B, K), priced as the engine runs the method (tuner/methods.py) with the
deployment's acceptance. Both released engines take such a schedule: vLLM 0.33's
`speculative_config.num_speculative_tokens_per_batch_size` ([lo, hi, K] ranges from 1, K = 0 switching speculation
off) and SGLang 0.5.23's `--speculative-adaptive-config` (batch-size lower bounds, each with its candidate steps;
EAGLE / EAGLE3 / NEXTN only). For DSpark the SPS table carries the same information to SGLang's own scheduler.
"""

from __future__ import annotations

from typing import Any

from tuner.acceptance import AcceptanceModel
from tuner.methods import Drafting, EngineCosts, round_cost
from tuner.perf import PerfModel


def best_k(perf: PerfModel, costs: EngineCosts, d: Drafting, accept: AcceptanceModel, batch: int, k_max: int,
           context: float) -> tuple[int, float]:
    """(K in 0..k_max maximising committed tokens per second at `batch` running requests, that rate)."""
    plain = batch / round_cost(perf, costs, d, batch, 0, context).seconds
    best = (0, plain)
    for k in range(1, k_max + 1):
        rate = batch * accept.tau(k) / round_cost(perf, costs, d, batch, k, context).seconds
        if rate > best[1] * 1.01:  # a longer draft has to pay for itself clearly
            best = (k, rate)
    return best


def batch_schedule(perf: PerfModel, costs: EngineCosts, d: Drafting, accept: AcceptanceModel, k_max: int,
                   max_batch: int, context: float) -> list[list[int]]:
    """[[lo, hi, K], ...] covering 1..max_batch with the best K per batch size (non-increasing with the batch),
    equal neighbours merged."""
    probes = sorted({b for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
                     if b <= max_batch} | {max_batch})
    picks, floor = [], k_max
    for b in probes:  # never longer under more load: the kernel tables' small bumps must not make K zig-zag
        floor = min(floor, best_k(perf, costs, d, accept, b, k_max, context)[0])
        picks.append((b, floor))
    out: list[list[int]] = []
    for i, (b, k) in enumerate(picks):
        hi = picks[i + 1][0] - 1 if i + 1 < len(picks) else max_batch
        if out and out[-1][2] == k:
            out[-1][1] = hi
        else:
            out.append([1 if not out else b, hi, k])
    return out


def k_at(schedule: list[list[int]], batch: int) -> int:
    """The schedule's K at `batch` running requests (past the last range: its K, as vLLM carries it forward)."""
    for lo, hi, k in schedule:
        if lo <= batch <= hi:
            return k
    return schedule[-1][2] if schedule else 0


def vllm_schedule(schedule: list[list[int]]) -> dict[str, Any]:
    """vLLM 0.33's speculative_config fields: the ranges, and num_speculative_tokens = their largest K (the
    engine clamps every range to it and sizes its CUDA graphs for it)."""
    return {"num_speculative_tokens": max(k for _, _, k in schedule),
            "num_speculative_tokens_per_batch_size": [list(r) for r in schedule]}


def sglang_adaptive_config(schedule: list[list[int]]) -> dict[str, Any]:
    """SGLang 0.5.23's --speculative-adaptive-config: per batch-size lower bound, the candidate steps (the tuned K,
    and one step shorter so the acceptance EMA can step down), 0 where speculation does not pay."""
    out: dict[str, Any] = {}
    for lo, _, k in schedule:
        out[str(lo)] = {"candidate_steps": sorted({k, max(0, k - 1)}) if k else [0]}
    return out
