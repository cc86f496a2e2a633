"""Where a speculative method's rounds go on the real target: per grid the rounds' wall time against their target
step, the packed scheduler's predicted step seconds against the measured, and its expected tokens against those
committed (issue 42: why chat at 8 requests stays below plain).

Runs `bench`'s plain and one method once each on the same prompts, through the engine the bench builds, and wraps
that method's round, scheduler decisions and timed steps:

    python benchmarks/round_trace.py --method suffix/prefix --concurrency 8 \
        --prompts benchmarks/prompts/heldout_chat.jsonl [--limit 16] [--collector frozen|unfrozen|off] [--json]

`--collector`: `frozen` as the engine runs (the heap frozen after compiling, `compiled.freeze_heap`), `unfrozen`
without that freeze, `off` with Python's collector off for the timed pass: what the collector costs a round.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "benchmarks" / "configs" / "suffix_full_block.yaml"


def real_target(prompts: Path, limit: int) -> tuple[Any, Any, Any, list[list[int]]]:
    """(the suffix config on SmolLM2-135M bf16, compiled; its target; tokenizer; the prompts' ids, their last 1,024
    tokens) on two threads: what this script and benchmarks/mixed_prefill.py run on."""
    import torch

    from dspark_core.cli.commands import _config
    from dspark_core.cli.prompts import load_prompts
    from dspark_core.modeling.checkpoint import load_model
    from dspark_core.modeling.tokenizer import Tokenizer

    torch.set_num_threads(2)
    cfg = _config(CONFIG, "smollm2-135m", "bf16")
    cfg.compile = True
    target = load_model(cfg.model.path, cfg.device, cfg.weights.dtype)
    tok = Tokenizer.load(cfg.model.tokenizer or cfg.model.path, target.arch.eos_ids)
    return cfg, target, tok, [tok.encode(r.prompt)[-1024:] for r in load_prompts(prompts, limit)]


def run(method: str, concurrency: int, prompts: Path, limit: int, collector: str) -> dict[str, Any]:
    import torch

    import dspark_core.modeling.compiled as compiled
    import dspark_core.verification.verify_scheduler as vs
    from dspark_core.cli.bench import BenchSpec, build_methods, run_bench
    from dspark_core.modeling.compiled import bucket
    from dspark_core.verification.sampling import SamplingParams

    cfg, target, tok, ids = real_target(prompts, limit)
    spec = BenchSpec(prompts=ids, methods=["plain", method], repeats=1, concurrency=concurrency, block_size=8,
                     sampling=SamplingParams(temperature=0.0, max_new_tokens=128, seed=0))
    built = build_methods(spec, cfg, target, tok)
    eng = built[1].engine
    sch = eng.scheduler
    steps: list[tuple[tuple[int, int], int, float, float | None]] = []  # (grid, real tokens, measured, predicted)
    rounds: list[tuple[tuple[int, int] | None, float, float]] = []  # (grid, round wall, its step)
    decisions: list[Any] = []
    outcomes: list[tuple[int, int]] = []  # (decisions so far, tokens committed)
    took, choose, observe, round_ = sch.step_took, vs.packed_schedule, sch.observe, eng._round

    def step_took(rows: int, tokens: int, seconds: float, real: int | None = None) -> None:
        grid = (bucket(rows), sch._size(tokens))
        pred = sch.grid.seconds(grid, real or rows) if sch.grid is not None and grid in sch.grid.low else None
        steps.append((grid, real or rows * tokens, seconds, pred))
        took(rows, tokens, seconds, real)

    def packed_schedule(*a: Any, **k: Any) -> Any:
        d = choose(*a, **k)
        decisions.append(d)
        return d

    def observe_(results: list[Any]) -> None:
        outcomes.append((len(decisions), sum(len(r.new_tokens) for r in results) if any(r.verified for r in results)
                         else -1))
        observe(results)

    def timed_round(*a: Any, **k: Any) -> Any:
        t0, n0 = time.perf_counter(), len(steps)
        out = round_(*a, **k)
        rounds.append((steps[-1][0] if len(steps) > n0 else None, time.perf_counter() - t0,
                       steps[-1][2] if len(steps) > n0 else 0.0))
        return out

    sch.step_took, sch.observe, eng._round, vs.packed_schedule = step_took, observe_, timed_round, packed_schedule
    freeze = compiled.freeze_heap
    if collector == "unfrozen":
        compiled.freeze_heap = lambda: None
    if collector == "off":
        gc.disable()
    try:
        rows = run_bench(spec, built)
    finally:
        gc.enable()
        vs.packed_schedule, compiled.freeze_heap = choose, freeze
    by_grid: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for grid, wall, step in rounds:
        by_grid[grid].append((wall, step))
    pred = defaultdict(list)
    for grid, real, sec, p in steps:
        pred[grid].append((real, sec, p))
    spec_rounds = [(decisions[n - 1], c) for n, c in outcomes if c >= 0 and n > 0]
    return {
        "capability": torch.backends.cpu.get_cpu_capability(), "method": method, "concurrency": concurrency,
        "collector": collector,
        "tokens_per_s": {r.name: round(r.tokens / r.seconds, 2) for r in rows},
        # grid None: rounds whose verify step also prefilled admissions (compiled_mixed), which step_took skips
        "grids": [{"grid": list(g) if g else None, "rounds": len(v),
                   "wall_ms": round(sum(w for w, _ in v) / len(v) * 1e3, 2),
                   "step_ms": round(sum(s for _, s in v) / len(v) * 1e3, 2),
                   "predicted_step_ms": round(sum(p or 0 for _, _, p in pred[g]) / len(pred[g]) * 1e3, 2)
                   if pred.get(g) and all(p is not None for _, _, p in pred[g]) else None,
                   "real_tokens": round(sum(r for r, _, _ in pred[g]) / len(pred[g]), 1) if pred.get(g) else None}
                  for g, v in sorted(by_grid.items(), key=lambda kv: kv[0] or (0, 0))],
        "speculative_rounds": len(spec_rounds),
        "expected_tokens": round(sum(d.expected_tokens for d, _ in spec_rounds), 1),
        "committed_tokens": sum(c for _, c in spec_rounds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="suffix/prefix")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout_chat.jsonl")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--collector", choices=["frozen", "unfrozen", "off"], default="frozen")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = run(a.method, a.concurrency, a.prompts, a.limit, a.collector)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"capability {out['capability']}, {a.method} at {a.concurrency} requests, collector {out['collector']}: "
          f"tok/s {out['tokens_per_s']}")
    for g in out["grids"]:
        print(f"grid {g['grid']}: {g['rounds']} rounds, wall {g['wall_ms']} ms, step {g['step_ms']} ms "
              f"(predicted {g['predicted_step_ms']}), real tokens {g['real_tokens']}")
    print(f"speculative rounds {out['speculative_rounds']}: expected tokens {out['expected_tokens']}, "
          f"committed {out['committed_tokens']}")


if __name__ == "__main__":
    main()
