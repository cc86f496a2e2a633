"""DSpark (part 2) bench on held-out code: drafters against plain and transformers assisted generation, and
the prefix scheduler against verify_all with many requests in flight. Records its own RESULTS.md section.

Usage: python benchmarks/bench_dspark.py [--block-size 8] [--repeats 2] [--limit N] [--concurrency 8]
                                        [--batch-block-sizes 8,16]
Runs `python cli.py bench ... --json` once one request at a time, then with --concurrency C and the
scheduler variants at each batch block size (the confidence scheduler has more to trim in longer blocks;
16 is the committed drafters' trained block), keeps the JSON in results/bench_dspark*.json and rewrites
only the section between the bench_dspark markers of RESULTS.md. Greedy; lossless = outputs
token-identical to plain.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from results_md import bench_table, write_section

HERE = Path(__file__).parent
ROOT = HERE.parent


def run_bench(args: argparse.Namespace, methods: str, concurrency: int, block: int) -> tuple[dict, str]:
    """One `cli.py bench` run -> (its JSON, the command as shown)."""
    cmd = [sys.executable, "cli.py", "bench", "--prompts", args.prompts, "--max-new-tokens", str(args.max_new_tokens),
           "--methods", methods, "--repeats", str(args.repeats), "--block-size", str(block),
           "--threads", str(args.threads), "--concurrency", str(concurrency), "--json"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout), " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="benchmarks/prompts/heldout_code.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--methods", default="plain,hf_assisted,dflash,dspark_markov,dspark_rnn")
    ap.add_argument("--batch-methods", default="plain,dspark_markov/verify_all,dspark_markov/prefix")
    ap.add_argument("--batch-block-sizes", default="8,16", help="block sizes of the concurrency runs")
    args = ap.parse_args()
    single, cmd1 = run_bench(args, args.methods, 1, args.block_size)
    batches = [(int(g), *run_bench(args, args.batch_methods, args.concurrency, int(g)))
               for g in args.batch_block_sizes.split(",")]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_dspark.json").write_text(json.dumps(single, indent=2) + "\n")
    (HERE / "results" / "bench_dspark_batch.json").write_text(
        json.dumps({str(g): b for g, b, _ in batches}, indent=2) + "\n")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        "## DSpark drafters (part 2): dflash vs dspark_markov vs dspark_rnn, and the prefix scheduler\n\n"
        f"Measured {when} on {single['device']} ({platform.processor() or platform.machine()}), "
        f"{single['prompts']} held-out prompts (code from site-packages), {single['max_new_tokens']} new tokens "
        f"each, greedy, block size {args.block_size}, {args.repeats} interleaved repeats.\n\n"
        f"Command: `python benchmarks/bench_dspark.py` which runs\n`{cmd1}`\n\n{bench_table(single)}\n\n"
        + "".join(f"With {args.concurrency} requests in flight, block size {g} (`{cmd}`):\n\n{bench_table(b)}\n\n"
                  for g, b, cmd in batches)
        +
        "Offline acceptance figures (per-position conditional acceptance, tau against gamma, STS ECE): "
        "`python benchmarks/dspark_acceptance.py` -> results/dspark_acceptance.{json,png}.\n"
    )
    write_section("bench_dspark", text)
    print(text)


if __name__ == "__main__":
    main()
