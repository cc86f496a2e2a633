"""argmax against top1 (max(dim).indices, dspark_core/modeling/argmax.py) over vocabulary-wide rows on this CPU.

The greedy paths (a verify step's tokens, a prefill's first token, the drafter's per-position choice) reduce
[rows, V] logits every round; this times both reductions interleaved and checks they agree:

    python benchmarks/top1_cost.py [--vocab 49152] [--rows 1,8,30,72] [--json]
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


def run(vocab: int, rows: list[int], threads: int, repeats: int = 200) -> dict[str, Any]:
    import torch

    from dspark_core.modeling.argmax import top1

    torch.set_num_threads(threads)
    out = []
    for n in rows:
        x = torch.randn(n, vocab)
        assert torch.equal(top1(x), x.argmax(-1))
        times: dict[str, list[float]] = {"argmax": [], "top1": []}
        for _ in range(repeats):
            for name, fn in (("argmax", torch.argmax), ("top1", top1)):
                t0 = time.perf_counter()
                fn(x, -1) if name == "argmax" else fn(x)
                times[name].append(time.perf_counter() - t0)
        a, t = (statistics.median(times[k]) * 1e6 for k in ("argmax", "top1"))
        out.append({"rows": n, "argmax_us": round(a, 1), "top1_us": round(t, 1), "top1_x_argmax": round(t / a, 3)})
    return {"capability": torch.backends.cpu.get_cpu_capability(), "vocab": vocab, "threads": threads, "rows": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", default="1,8,30,72")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.vocab, [int(r) for r in a.rows.split(",")], a.threads)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"capability {res['capability']}, vocabulary {a.vocab}, {a.threads} threads, fp32")
    for r in res["rows"]:
        print(f"{r['rows']} rows: argmax {r['argmax_us']} us, top1 {r['top1_us']} us ({r['top1_x_argmax']}x)")


if __name__ == "__main__":
    main()
