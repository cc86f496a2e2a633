"""The prefill eager against compiled (modeling/compiled_prefill.py): what an admission costs the batch it joins.

A serving engine admits requests as slots free, mostly one at a time, and each admission's prefill stalls every
running request. This times the target's last-only prefill of fresh slots both ways, interleaved, on the real
target with the engine's kernels (oneDNN-packed weights where the CPU packs the dtype), with and without the
hidden states a DSpark drafter reads:

    python benchmarks/prefill_step.py [--model smollm2-135m] [--dtype bf16] [--repeats 7] [--json]
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

CASES = [[24], [40], [64], [30, 7, 19], [40] * 8]  # prompt tokens per admitted request


def run(model: str, dtype: str, repeats: int, threads: int) -> dict[str, Any]:
    import torch

    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.compiled import attach
    from dspark_core.modeling.cpu_linear import apply_kernel

    torch.set_num_threads(threads)
    target = load_model(checkpoint_folder(model), "cpu", dtype)
    kernel = apply_kernel(target, "auto")
    step = attach(target, (1,), float("inf"))
    cache = target.new_cache(8, 256)
    hidden = (0, target.arch.num_hidden_layers // 2, target.arch.num_hidden_layers - 1)

    def once(lens: list[int], layers: tuple[int, ...], compiled: bool) -> float:
        cache.lens.zero_()
        tokens = torch.randint(1, target.arch.vocab_size, (len(lens), max(lens)))
        target.compiled = step if compiled else None
        try:
            t0 = time.perf_counter()
            target(tokens, cache, list(range(len(lens))), lens, hidden_layers=layers, last_only=True)
            return time.perf_counter() - t0
        finally:
            target.compiled = step

    times: dict[tuple[int, tuple[int, ...], bool], list[float]] = {}
    for lens in CASES:  # compile (or load) every graph first
        for layers in ((), hidden):
            once(lens, layers, True)
    for _ in range(repeats):
        for i, lens in enumerate(CASES):
            for layers in ((), hidden):
                for compiled in (False, True):
                    times.setdefault((i, layers, compiled), []).append(once(lens, layers, compiled))
    rows = []
    for i, lens in enumerate(CASES):
        for layers in ((), hidden):
            eager, comp = (statistics.median(times[(i, layers, c)]) for c in (False, True))
            rows.append({"prompt_tokens": lens, "hidden_layers": list(layers), "eager_ms": round(eager * 1e3, 2),
                         "compiled_ms": round(comp * 1e3, 2), "compiled_x_eager": round(comp / eager, 3)})
    return {"capability": torch.backends.cpu.get_cpu_capability(), "model": model, "dtype": dtype, "kernel": kernel,
            "threads": threads, "repeats": repeats, "prefills": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = run(a.model, a.dtype, a.repeats, a.threads)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"capability {out['capability']}, {a.model} {a.dtype}, kernel {out['kernel']}, {a.threads} threads")
    for r in out["prefills"]:
        print(f"prompts {r['prompt_tokens']}, hidden {r['hidden_layers'] or 'none'}: eager {r['eager_ms']} ms, "
              f"compiled {r['compiled_ms']} ms ({r['compiled_x_eager']}x)")


if __name__ == "__main__":
    main()
