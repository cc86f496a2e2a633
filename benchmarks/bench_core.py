"""Run the part-1 engine bench on held-out code prompts and record the table in benchmarks/RESULTS.md.

Usage: python benchmarks/bench_core.py [--max-new-tokens 64] [--repeats 3] [--block-size 5] [--limit N]
It calls `python cli.py bench ... --json`, keeps the JSON beside this script (results/bench_core.json)
and rewrites only its own section of RESULTS.md (between the bench_core markers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from results_md import bench_table, write_section

HERE = Path(__file__).parent
ROOT = HERE.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="benchmarks/prompts/heldout_code.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="plain,hf_assisted,ar_draft,ngram")
    args = ap.parse_args()
    cmd = [sys.executable, "cli.py", "bench", "--prompts", args.prompts, "--max-new-tokens",
           str(args.max_new_tokens), "--methods", args.methods, "--repeats", str(args.repeats),
           "--block-size", str(args.block_size), "--threads", str(args.threads), "--json"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    load = f"load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after the run (shared cores)"
    if proc.returncode != 0:
        sys.exit(f"bench failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(proc.stdout)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_core.json").write_text(json.dumps(result, indent=2) + "\n")
    shown = " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        "## Engine core (part 1): plain vs transformers assisted generation vs our loop\n\n"
        f"Measured {when} on {result['device']} ({platform.processor() or platform.machine()}), "
        f"{result['prompts']} held-out prompts (code from site-packages, never seen in training), "
        f"{result['max_new_tokens']} new tokens each, temperature {result['temperature']}, "
        f"block size {result['block_size']}, {result['repeats']} interleaved repeats, one request at a time; "
        f"{load}.\n\n"
        f"Command: `python benchmarks/bench_core.py` which runs\n`{shown}`\n\n"
        f"{bench_table(result)}\n\n"
        "tau = tokens committed per round including the target's own token; per-position acceptance = "
        "P(position j accepted | earlier positions accepted); lossless = greedy outputs token-identical to "
        "plain. hf_assisted uses transformers' default assistant schedule (heuristic, starting at 20 "
        "draft tokens) with the same fp32 target and draft checkpoints.\n"
    )
    write_section("bench_core", text)
    print(text)


if __name__ == "__main__":
    main()
