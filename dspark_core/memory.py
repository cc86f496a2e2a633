"""The memory a load will allocate, estimated from the configs before anything is allocated, against what is free.

Why: sizes inside their bounds (config_schema.py) can still multiply past the machine (a 2**24 x 65536 embedding is
4 TiB; a KV cache of 4096 requests x 10**8 positions more), and torch then dies in the allocator or the kernel kills
the process. `ensure_fits` refuses such a load with one line giving the estimate, what is free and what to lower.

The estimate: weights = parameters x bytes per weight in the load dtype (fp8 / int8 / int4 / nvfp4 load in bf16 and
are quantised afterwards); a load also holds the checkpoint's tensors as read (their bytes in the file) while it
builds the model; KV cache = layers x 2 (K, V) x batch.max_requests x (model.max_seq_len + 32) x KV heads x head
width x bytes; a DSpark drafter adds its parameters (its W1 / W2 Markov matrices are vocab x rank each) and its
context K / V over the same slots and positions. Free memory: `torch.cuda.mem_get_info` on a CUDA device, else
`MemAvailable` (psutil, or /proc/meminfo). A load fits when estimate + headroom <= free, headroom = max(10% of the
estimate, 256 MiB). Where free memory cannot be read, nothing is refused.
"""

from __future__ import annotations

from pathlib import Path

from dspark_core.errors import DSparkError

HEADROOM_FRACTION = 0.10
HEADROOM_MIN = 256 * 2**20
KV_MARGIN = 32  # positions LeanModel.new_cache adds per slot for padded blocks
GIB = 2**30


def free_bytes(device: str) -> int | None:
    """Bytes free for allocations on `device` ('cpu', 'cuda', 'cuda:N'); None when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(n: int) -> str:
    """Bytes as GiB with two decimals (or MiB under one GiB)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def ensure_fits(parts: dict[str, int], device: str, what: str, fix: str) -> None:
    """Refuse (one DSparkError line) when the sum of `parts` (name -> bytes) plus headroom exceeds the memory free on
    `device`. `what`: what is being loaded; `fix`: what to lower."""
    total = sum(parts.values())
    free = free_bytes(device)
    if free is None:
        return
    need = total + max(int(total * HEADROOM_FRACTION), HEADROOM_MIN)
    if need <= free:
        return
    detail = ", ".join(f"{name} {gib(n)}" for name, n in parts.items() if n)
    raise DSparkError(f"{what} needs about {gib(total)} ({detail}) but {device} has {gib(free)} free (with headroom "
                      f"{gib(need - total)}); {fix}")


def kv_bytes(layers: int, kv_heads: int, head_dim: int, slots: int, positions: int, elem: int) -> int:
    """Bytes of a slot-indexed K + V cache: layers x 2 x slots x (positions + margin) x kv_heads x head_dim."""
    return layers * 2 * slots * (positions + KV_MARGIN) * kv_heads * head_dim * elem
