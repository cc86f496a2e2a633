"""Our bf16 attention kernel against SDPA's, one layer's attention over the KV cache at the shapes the engine steps.

SmolLM2-135M's attention shape (9 query heads on 3 KV heads of 64), keys and values read from a cache laid out as the
engine's ([slots, positions, kv heads, head dim], strided), every row at `--context` positions: rows 1 and 8, tokens
1 (decode) and 3, 5, 9 (verify), each through `attend` with SDPA (no prefix lengths) and with our kernel
(dspark_core/modeling/cpu_attention.py), interleaved in one run; the max error of each against fp32 attention.
Then ragged verify steps: 8 rows on a 9-token grid verifying RAGGED tokens a row (a packed step's attention runs
on that grid): our kernel with the padding queries skipped (lens 0, as the compiled step passes them) against the
same kernel over the whole grid (what the step ran before) and SDPA.
The whole step's share of it is step_limit.py's `onednn` against `onednn-sdpa`.

    python benchmarks/cpu_attention.py [--threads 2] [--context 256] [--json] [--write]

A benchmark, not a test. Needs an AVX512-BF16 CPU (the kernel's one) and a C compiler.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

NH, NKV, HD = 9, 3, 64  # SmolLM2-135M's heads
ROWS, TOKENS = (1, 8), (1, 3, 5, 9)
RAGGED = ((5, 1, 2, 1, 1, 1, 1, 1), (9, 1, 4, 2, 1, 3, 1, 2))  # tokens verified per row: 13 and 23 of 8 x 9


def timed(fn, repeats: int = 7) -> float:  # median microseconds a call over `repeats` rounds of >= 0.2 s
    fn()
    got = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while n < 5 or time.perf_counter() - t0 < 0.2:
            fn()
            n += 1
        got.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="the RESULTS.md section")
    a = ap.parse_args()
    from results_md import check_ranges

    check_ranges("cpu_attention", (("--threads", a.threads, 1, 256), ("--context", a.context, 16, 32768)))
    import torch

    from dspark_core.modeling import cpu_attention
    from dspark_core.modeling.model import attend

    torch.set_num_threads(a.threads)
    cap = torch.backends.cpu.get_cpu_capability()
    if not cpu_attention.load():
        print(f"our attention kernel does not run here ({cap}): {cpu_attention.why}", file=sys.stderr)
        return 2
    rows = []
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for b in ROWS:
            for t in TOKENS:
                q, keys, vals, pos, mask = layer_inputs(b, t, a.context, g)
                ref = attend(q.float(), keys.float(), vals.float(), mask)
                err = {name: round(float((out.float() - ref).abs().max()), 5) for name, out in
                       (("sdpa", attend(q, keys, vals, mask)), ("ours", attend(q, keys, vals, mask, pos + 1)))}
                sd = timed(lambda: attend(q, keys, vals, mask))  # noqa: B023 - timed at once
                ours = timed(lambda: attend(q, keys, vals, mask, pos + 1))  # noqa: B023
                rows.append({"rows": b, "tokens": t, "sdpa_us": round(sd, 1), "ours_us": round(ours, 1),
                             "sdpa_over_ours": round(sd / ours, 2), "max_err": err})
                print(rows[-1], file=sys.stderr)
        ragged = [ragged_row(n, a.context, g) for n in RAGGED]
    result = {"capability": cap, "threads": a.threads, "context": a.context,
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows, "ragged": ragged}
    if a.json:
        print(json.dumps(result))
    if a.write:
        write(result)
    return 0


def layer_inputs(b: int, t: int, context: int, g: Any) -> tuple[Any, ...]:
    """One layer's step inputs: q [B, nh, T, hd] (a transposed view, as the model passes it), keys and values read
    from a cache laid out as the engine's ([slots, positions, kv heads, hd], strided), every row at `context`
    positions; the positions [B, T] and their mask."""
    import torch

    lk = context + t
    q = torch.randn(b, t, NH, HD, generator=g).to(torch.bfloat16).transpose(1, 2)
    kc, vc = (torch.randn(b, lk + 64, NKV, HD, generator=g).to(torch.bfloat16) for _ in range(2))
    keys, vals = kc[:, :lk].transpose(1, 2), vc[:, :lk].transpose(1, 2)
    pos = torch.full((b, t), context) + torch.arange(t)
    mask = (torch.arange(lk)[None, None, :] <= pos[:, :, None])[:, None]
    return q, keys, vals, pos, mask


def ragged_row(n: tuple[int, ...], context: int, g: Any) -> dict[str, Any]:
    """One ragged step's attention, its rows verifying n[b] tokens on a max(n)-wide grid: ours with the padding
    skipped, ours over the whole grid, SDPA (which computes the grid under the mask)."""
    import torch

    from dspark_core.modeling.model import attend

    b, t = len(n), max(n)
    q, keys, vals, pos, mask = layer_inputs(b, t, context, g)
    live = torch.arange(t)[None, :] < torch.tensor(n)[:, None]  # [B, T]
    lens = (pos + 1) * live
    sd = timed(lambda: attend(q, keys, vals, mask))
    dense = timed(lambda: attend(q, keys, vals, mask, pos + 1))
    ours = timed(lambda: attend(q, keys, vals, mask, lens))
    row = {"rows": b, "grid": t, "real": sum(n), "sdpa_us": round(sd, 1), "whole_grid_us": round(dense, 1),
           "ours_us": round(ours, 1), "whole_grid_over_ours": round(dense / ours, 2)}
    print(row, file=sys.stderr)
    return row


def write(r: dict[str, Any]) -> None:
    from results_md import write_section

    lines = [f"## Attention at 8 requests: our bf16 kernel against SDPA on {r['capability']} (issue 41, "
             f"{r['when']})", "",
             f"`python benchmarks/cpu_attention.py --write` on a CPU with capability **{r['capability']}** "
             f"({r['threads']} threads): one layer's attention of SmolLM2-135M (9 query heads, 3 KV heads of 64) over "
             f"a bf16 cache laid out as the engine's, every row at {r['context']} positions, through `attend` with "
             "SDPA and with dspark_core/modeling/cpu_attention.py; medians of interleaved rounds; max error against "
             "fp32 attention.", "",
             "| rows | tokens a row | SDPA us | ours us | SDPA / ours | max err SDPA | max err ours |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["rows"]:
        lines.append(f"| {x['rows']} | {x['tokens']} | {x['sdpa_us']} | {x['ours_us']} | {x['sdpa_over_ours']} | "
                     f"{x['max_err']['sdpa']} | {x['max_err']['ours']} |")
    lines += ["", "Ragged verify steps (8 rows on a grid as wide as the longest row's tokens; the compiled step's "
              "packed verify runs attention on that grid): our kernel skipping the padding queries, the same kernel "
              "over the whole grid (the step before 2026-12-07 13:30 UTC), SDPA under the mask.", "",
              "| rows x grid | real tokens | SDPA us | ours, whole grid us | ours, padding skipped us "
              "| whole / skipped |",
              "|---|---:|---:|---:|---:|---:|"]
    for x in r.get("ragged", []):
        lines.append(f"| {x['rows']} x {x['grid']} | {x['real']} | {x['sdpa_us']} | {x['whole_grid_us']} | "
                     f"{x['ours_us']} | {x['whole_grid_over_ours']} |")
    write_section(f"cpu_attention_{r['capability'].lower()}", "\n".join(lines))
    (ROOT / "benchmarks" / "results" / f"cpu_attention_{r['capability'].lower()}.json").write_text(
        json.dumps(r, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
