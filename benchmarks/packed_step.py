"""A compiled verify step dense against packed: what a grid costs at the real tokens it holds (issue 42).

The engine's CPU verify steps run packed (dspark_core/modeling/compiled.py `_packed`): only the real tokens go
through the GEMMs, attention spans the rows x T grid. This times the same steps both ways, interleaved, on the real
target with the engine's kernels (oneDNN-packed weights where the CPU packs the dtype), at a fixed context:

    python benchmarks/packed_step.py [--model smollm2-135m] [--dtype bf16] [--context 256] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (rows, grid tokens per row, real tokens per row): a lone request's short verify, one row verifying in a batch,
# a mixed batch, and full grids
CASES = [(1, 1, [1]), (1, 9, [9]), (1, 9, [5]), (8, 1, [1] * 8), (8, 3, [3] + [1] * 7), (8, 3, [3] * 8),
         (8, 9, [9, 5] + [1] * 6), (8, 9, [9] * 8)]


def run(model: str, dtype: str, context: int, repeats: int, threads: int) -> dict[str, Any]:
    import torch

    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.compiled import attach
    from dspark_core.modeling.cpu_linear import apply_kernel

    torch.set_num_threads(threads)
    target = load_model(checkpoint_folder(model), "cpu", dtype)
    kernel = apply_kernel(target, "auto")
    step = attach(target, (1, 3, 9), float("inf"))
    cache = target.new_cache(8, context + 32)

    def once(rows: int, t: int, n_new: list[int]) -> float:
        for r in range(rows):
            cache.truncate(r, context)
        t0 = time.perf_counter()
        target(torch.randint(1, target.arch.vocab_size, (rows, t)), cache, list(range(rows)), n_new)
        return time.perf_counter() - t0

    times: dict[tuple[bool, int], list[float]] = {}
    for pack in (False, True):  # compile every shape both ways first
        step.pack = pack
        for case in CASES:
            once(*case)
    for _ in range(repeats):
        for pack in (False, True):
            step.pack = pack
            for i, case in enumerate(CASES):
                times.setdefault((pack, i), []).append(once(*case))
    base = statistics.median(times[(False, 0)])
    rows = []
    for i, (b, t, n_new) in enumerate(CASES):
        dense, packed = (statistics.median(times[(p, i)]) for p in (False, True))
        rows.append({"rows": b, "grid_tokens": t, "real_tokens": sum(n_new), "dense_ms": round(dense * 1e3, 2),
                     "packed_ms": round(packed * 1e3, 2), "dense_x": round(dense / base, 3),
                     "packed_x": round(packed / base, 3)})
    return {"capability": torch.backends.cpu.get_cpu_capability(), "model": model, "dtype": dtype, "kernel": kernel,
            "threads": threads, "context": context, "repeats": repeats, "steps": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = run(a.model, a.dtype, a.context, a.repeats, a.threads)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"capability {out['capability']}, {a.model} {a.dtype} ({out['kernel']} linears), {a.threads} threads, "
          f"context {a.context}; ms (x the dense 1 x 1 step)")
    for r in out["steps"]:
        print(f"{r['rows']} x {r['grid_tokens']:>2}, {r['real_tokens']:>2} real: dense {r['dense_ms']:7.2f} "
              f"({r['dense_x']:.2f}x)  packed {r['packed_ms']:7.2f} ({r['packed_x']:.2f}x)")


if __name__ == "__main__":
    main()
