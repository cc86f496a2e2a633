"""Admissions prefilled inside the running batch's verify step against prefills of their own (issue 42).

An engine at eight requests admits a request whenever one finishes. With `batch.mixed_prefill_tokens` (64 by
default) the compiled step prefills a short prompt inside the next round's verify forward
(dspark_core/modeling/compiled_mixed.py); off (0), each admission runs its own prefill forward first. This runs
plain and each speculative method both ways: one engine per method (so one verify scheduler for both modes), its
passes over the same prompts rotated with every other method's and mode's (compiled bf16 target, 128 new tokens,
greedy). Per method and mode: tok/s, x plain (mixed), and what admissions cost: their own prefills' seconds, or the
mixed rounds' seconds beyond the mean round of the pass:

    python benchmarks/mixed_prefill.py [--prompts benchmarks/prompts/heldout_chat.jsonl] [--limit 64] \
        [--methods suffix/prefix,hybrid_markov/prefix] [--concurrency 8] [--repeats 3] [--json]

`--step`: time the step alone instead, per prompt length (20, 40, 80, 180 tokens): an 8-row verify, the prompt's own
compiled prefill, both one after the other, and the verify with the prompt mixed in (ms, medians of interleaved
repeats). Where the prompt's own prefill is compute-bound, mixing it in saves nothing: the default limit.
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

from round_trace import real_target  # noqa: E402 - after the path it lives on


def run(prompts: Path, limit: int, methods: list[str], concurrency: int, repeats: int) -> dict[str, Any]:
    """Plain and `methods`, each one engine run with mixing on (batch.mixed_prefill_tokens) and off, `repeats` rotated
    passes over the prompts; per method and mode: tokens, seconds, and what admissions cost (their own prefills'
    seconds; mixed, the mixed rounds' seconds beyond the mean round of the same pass)."""
    import torch

    from dspark_core.cli.bench import BenchSpec, build_methods
    from dspark_core.engine import Engine
    from dspark_core.engine_parts import warm_steps
    from dspark_core.verification.sampling import SamplingParams

    cfg, target, tok, ids = real_target(prompts, limit)
    sp = SamplingParams(temperature=0.0, max_new_tokens=128, seed=0)
    spec = BenchSpec(prompts=ids, methods=["plain", *methods], repeats=repeats, concurrency=concurrency,
                     block_size=8, sampling=sp)
    engines = {m.name: m.engine for m in build_methods(spec, cfg, target, tok)}
    limit_tokens = cfg.batch.mixed_prefill_tokens
    for eng in engines.values():  # every shape compiled before anything is timed
        eng.generate([ids[0][:32]], sp.model_copy(update={"max_new_tokens": 8}))
        warm_steps(eng, concurrency)
    log: list[tuple[str, float]] = []  # ("round" | "mixed" | "admit", seconds) of the pass running
    round_, admit = Engine._round, Engine._admit

    def timed_round(self: Engine, running: list[Any], batch: list[Any]) -> list[list[int]]:
        t0 = time.perf_counter()
        out = round_(self, running, batch)
        log.append(("mixed" if batch else "round", time.perf_counter() - t0))
        return out

    def timed_admit(self: Engine, batch: list[Any]) -> list[Any]:
        t0 = time.perf_counter()
        out = admit(self, batch)
        log.append(("admit", time.perf_counter() - t0))
        return out

    runs = [(name, mixed) for name in engines for mixed in (True, False)]
    rows = {r: {"tokens": 0, "seconds": 0.0, "admissions": 0, "admission_s": 0.0} for r in runs}
    Engine._round, Engine._admit = timed_round, timed_admit  # type: ignore[method-assign]
    try:
        for rep in range(repeats):
            for name, mixed in runs[rep % len(runs):] + runs[: rep % len(runs)]:
                eng = engines[name]
                eng.config.batch.mixed_prefill_tokens = limit_tokens if mixed else 0
                if eng.drafter is not None:  # no pass may draft from an earlier pass's outputs
                    eng.drafter.forget()
                log.clear()
                gen = eng.generate(ids, sp)
                plain_rounds = [t for k, t in log if k == "round"]
                mean = statistics.mean(plain_rounds) if plain_rounds else 0.0
                row = rows[(name, mixed)]
                row["tokens"] += gen.stats.generated_tokens
                row["seconds"] += gen.stats.seconds
                row["admissions"] += sum(k != "round" for k, _ in log)
                row["admission_s"] += sum(t if k == "admit" else t - mean for k, t in log if k != "round")
    finally:
        Engine._round, Engine._admit = round_, admit  # type: ignore[method-assign]
    base = rows[("plain", True)]["tokens"] / rows[("plain", True)]["seconds"]
    out = []
    for (name, mixed), r in rows.items():
        tps = r["tokens"] / r["seconds"]
        out.append({"method": name, "mixed_prefill": mixed, "tokens_per_s": round(tps, 2),
                    "x_plain": round(tps / base, 3), "admissions": r["admissions"],
                    "admission_ms": round(r["admission_s"] / max(r["admissions"], 1) * 1e3, 1),
                    "admission_share": round(r["admission_s"] / r["seconds"], 4)})
    return {"capability": torch.backends.cpu.get_cpu_capability(), "prompts_file": str(prompts), "prompts": len(ids),
            "concurrency": concurrency, "repeats": repeats, "max_new_tokens": 128, "rows": out}


def step(repeats: int, lengths: tuple[int, ...] = (20, 40, 80, 180)) -> dict[str, Any]:
    """Per prompt length: an 8-row verify (20 real tokens, context 300) alone, the prompt's own compiled prefill
    alone, the two one after the other, and the verify with the prompt mixed in; interleaved, medians."""
    import torch

    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.compiled import attach
    from dspark_core.modeling.cpu_linear import apply_kernel

    torch.set_num_threads(2)
    target = load_model(checkpoint_folder("smollm2-135m"), "cpu", "bf16")
    apply_kernel(target, "auto")
    compiled = attach(target, (1, 9), float("inf"))
    cache = target.new_cache(9, 600)
    v, slots, n_new = target.arch.vocab_size, list(range(8)), [9, 5] + [1] * 6
    rows = []
    for n in lengths:
        prompt = torch.randint(1, v, (1, n))

        def verify() -> None:
            target(torch.randint(1, v, (8, 9)), cache, slots, n_new)

        def prefill(p: torch.Tensor = prompt, n: int = n) -> None:
            target(p, cache, [8], [n], last_only=True)

        def mixed(p: torch.Tensor = prompt, n: int = n) -> None:
            compiled.mixed(torch.randint(1, v, (8, 9)), cache, slots, n_new, p, [8], [n])

        cases = {"verify": verify, "prefill": prefill, "apart": lambda: (prefill(), verify()), "mixed": mixed}
        times: dict[str, list[float]] = {k: [] for k in cases}
        for rep in range(repeats + 2):  # two untimed passes compile every graph
            for name, fn in cases.items():
                for s in slots:
                    cache.truncate(s, 300)
                cache.truncate(8, 0)
                t0 = time.perf_counter()
                fn()
                if rep >= 2:
                    times[name].append(time.perf_counter() - t0)
        ms = {k: round(statistics.median(t) * 1e3, 2) for k, t in times.items()}
        rows.append({"prompt_tokens": n, **{f"{k}_ms": x for k, x in ms.items()},
                     "saved_ms": round(ms["apart"] - ms["mixed"], 2)})
    return {"capability": torch.backends.cpu.get_cpu_capability(), "repeats": repeats, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout_chat.jsonl")
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--methods", default="suffix/prefix,hybrid_markov/prefix")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.step:
        out = step(max(a.repeats, 5))
        print(json.dumps(out, indent=1) if a.json else f"capability {out['capability']}; ms\n" + "\n".join(
            f"prompt {r['prompt_tokens']:>3}: verify {r['verify_ms']}, its own prefill {r['prefill_ms']}, one after "
            f"the other {r['apart_ms']}, mixed {r['mixed_ms']} (saves {r['saved_ms']})" for r in out["rows"]))
        return
    out = run(a.prompts, a.limit, [m for m in a.methods.split(",") if m], a.concurrency, a.repeats)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"capability {out['capability']}, {out['prompts']} prompts of {a.prompts.name}, {a.concurrency} requests, "
          f"{a.repeats} passes each")
    for r in out["rows"]:
        mode = "mixed" if r["mixed_prefill"] else "own prefills"
        print(f"{r['method']:<22} {mode:<13} {r['tokens_per_s']:8.2f} tok/s  {r['x_plain']:.3f}x plain (mixed)  "
              f"{r['admissions']} admissions at {r['admission_ms']} ms ({r['admission_share']:.1%} of the run)")

if __name__ == "__main__":
    main()
