"""The verify-length (lambda) rules against measurement on the real model: SmolLM2-135M in bfloat16 on this CPU.

For concurrency 1 and 8, the profile of this machine (`--gpu auto`: measured bandwidth and bf16 GEMM rate) is
matched into a plan, which says the roofline regime (derived.verify_budget) and the lambda range the rules give.
Then plain decoding and the committed Markov drafter at block 8 with the verify-all scheduler capped at lambda in
{1, 2, 4, 8} run the same held-out code prompts, interleaved in one process (ratios, never absolute times: the
cores are shared). The rule agrees when its range holds a lambda within --tolerance of the measured best.

    python benchmarks/verify_length_cpu.py [--limit 8] [--max-new-tokens 96] [--repeats 2] [--write]

Needs `python cli.py models fetch smollm2-135m`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAMBDAS = (1, 2, 4, 8)
BLOCK = 8


def planned_lambda(concurrency: int) -> tuple[dict[str, Any], list[int] | None, list[str]]:
    """This machine's derived roofline facts at `concurrency`, the plan's lambda range and the rules that set it."""
    from kb.loader import load_rules
    from kb.match import match_profile
    from kb.sync import StoredRule
    from profiler.build import build_profile
    from profiler.workload import Traffic

    profile = build_profile("smollm2-135m", "auto", "code", measure=True, entropy=False,
                            traffic=Traffic(concurrency=concurrency))
    plan = match_profile([StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules(ROOT / "rules")], profile)
    e = plan.space.get("spec.max_verify_tokens")
    rng = [int(e.low), int(e.high)] if e is not None and e.low is not None else None
    facts = {k: getattr(profile.derived, k) for k in ("decode_bound", "ridge_batch", "verify_budget")}
    return facts, rng, list(e.rules) if e is not None else []


def measure(concurrency: int, args: argparse.Namespace) -> dict[str, float]:
    """tok/s of each lambda relative to plain, interleaved in one run."""
    import torch

    from dspark_core.cli.bench import BenchSpec, EngineMethod, run_bench
    from dspark_core.cli.prompts import load_prompts
    from dspark_core.config import EngineConfig, apply_params
    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.verification.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    folder = str(checkpoint_folder("smollm2-135m"))
    target = load_model(folder, "cpu", "bf16")
    tok = Tokenizer.load(folder, target.arch.eos_ids)
    ids = [tok.encode(r.prompt)[-256:] for r in load_prompts(ROOT / args.prompts, args.limit)]
    base = apply_params(EngineConfig(), {"model.path": folder, "weights.dtype": "bf16", "spec.block_size": BLOCK,
                                         "batch.max_requests": concurrency, "model.max_seq_len": 1024})
    methods = [EngineMethod("plain", apply_params(base, {"drafter.method": "plain"}), target, tok)]
    for lam in LAMBDAS:
        cfg = apply_params(base, {"drafter.method": "dspark", "spec.head": "markov", "spec.scheduler": "verify_all",
                                  "spec.max_verify_tokens": lam})
        methods.append(EngineMethod(f"lambda={lam}", cfg, target, tok))
    spec = BenchSpec(prompts=ids, methods=[m.name for m in methods], repeats=args.repeats, concurrency=concurrency,
                     sampling=SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens))
    rows = {r.name: r for r in run_bench(spec, methods)}
    plain = rows["plain"].tokens / rows["plain"].seconds
    return {name: round(r.tokens / r.seconds / plain, 3) for name, r in rows.items() if name != "plain"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="benchmarks/prompts/heldout_code.jsonl")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--write", action="store_true", help="record the section verify_length_cpu of RESULTS.md")
    args = ap.parse_args()
    out = []
    for c in (1, 8):
        facts, rng, rules = planned_lambda(c)
        speed = measure(c, args)
        best = max(speed, key=speed.get)
        inside = [v for k, v in speed.items() if rng and rng[0] <= int(k.split("=")[1]) <= rng[1]]
        agrees = bool(inside) and max(inside) >= speed[best] * (1 - args.tolerance)
        out.append({"concurrency": c, "derived": facts, "lambda_range": rng, "rules": rules, "speedup": speed,
                    "best": best, "agrees": agrees})
        print(json.dumps(out[-1]), flush=True)
    if args.write:
        from benchmarks.results_md import write_section

        lines = ["## Verify-length rules vs measurement: SmolLM2-135M bf16 on this CPU (issue 17)", "",
                 f"Command: `python benchmarks/verify_length_cpu.py --write` ({time.strftime('%Y-%m-%d %H:%M UTC')}"
                 f"; {args.limit} held-out code prompts, {args.max_new_tokens} new tokens, greedy, block {BLOCK}, "
                 "committed Markov drafter, verify-all capped at lambda, interleaved with plain in one run). The "
                 "plan comes from this machine's measured profile (`--gpu auto`).", "",
                 "| concurrency | verify_budget (regime facts) | rules' lambda range | speedup over plain by lambda | "
                 "best | agrees |", "|---:|---|---|---|---|---|"]
        for r in out:
            sp = ", ".join(f"{k.split('=')[1]}: {v:.2f}x" for k, v in r["speedup"].items())
            d = r["derived"]
            lines.append(f"| {r['concurrency']} | {d['verify_budget']} ({d['decode_bound']}, ridge {d['ridge_batch']}"
                         f" tokens) | {r['lambda_range']} ({', '.join(r['rules'])}) | {sp} | {r['best']} | "
                         f"{'yes' if r['agrees'] else 'no'} |")
        write_section("verify_length_cpu", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
