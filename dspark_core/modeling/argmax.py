"""`top1(x)`: the index of the maximum along the last dimension, as `x.argmax(-1)`, at a third of its cost on a CPU.

On a CPU `Tensor.argmax` reduces a vocabulary-wide row about 3x slower than `Tensor.max(dim)`, which returns
the same indices: the first index of the maximum on ties, the NaN's index where a row holds one (tested against
argmax, tests/dspark_core/test_top1.py). SmolLM2's 49,152-wide fp32 rows, 2 threads, AVX512 (Intel Xeon, AMX):
1 row 64 -> 22 us, 8 rows 259 -> 81 us, 30 rows 1.01 -> 0.38 ms. A verify step's greedy tokens, a prefill's
first token and the drafter's per-position choice all take one: at 8 requests a round saves ~0.2-0.6 ms of ~25.
On a GPU `argmax` is kept (one kernel either way)."""

from __future__ import annotations

import torch


def top1(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> [...] long: argmax over the last dimension (first index on ties)."""
    if x.device.type == "cpu" and x.dim() > 0 and x.shape[-1] > 0:
        return x.max(-1).indices
    return x.argmax(-1)
