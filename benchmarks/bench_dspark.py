"""DSpark (part 2) bench on held-out code: drafters against plain and transformers assisted generation, and
the prefix scheduler against verify_all with many requests in flight. Records its own RESULTS.md section.

Usage: python benchmarks/bench_dspark.py [--block-size 8] [--repeats 2] [--limit N] [--concurrency 8]
Runs `python cli.py bench ... --json` twice (one request at a time; then --concurrency C with the
scheduler variants), keeps the JSON in results/bench_dspark*.json and rewrites only the section between
the bench_dspark markers of RESULTS.md. Greedy; lossless = outputs token-identical to plain.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
START, END = "<!-- bench_dspark:start -->", "<!-- bench_dspark:end -->"


def run_bench(args: argparse.Namespace, methods: str, concurrency: int) -> tuple[dict, str]:
    """One `cli.py bench` run -> (its JSON, the command as shown)."""
    cmd = [sys.executable, "cli.py", "bench", "--prompts", args.prompts, "--max-new-tokens", str(args.max_new_tokens),
           "--methods", methods, "--repeats", str(args.repeats), "--block-size", str(args.block_size),
           "--threads", str(args.threads), "--concurrency", str(concurrency), "--json"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout), " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])


def table(result: dict) -> str:
    lines = ["| method | tokens/s | speedup vs plain | tau | per-position acceptance | lossless |",
             "|---|---:|---:|---:|---|---|"]
    for m in result["methods"]:
        acc = " ".join(f"{x:.2f}" for x in m["position_acceptance"]) or "-"
        tau = f"{m['tau']:.2f}" if m["tau"] else "-"
        loss = {True: "yes", False: "no", None: "-"}[m["lossless"]]
        lines.append(f"| {m['name']} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}x | {tau} | {acc} | {loss} |")
    return "\n".join(lines)


def write_section(text: str) -> None:
    path = HERE / "RESULTS.md"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{START}\n{text}\n{END}"
    if START in old and END in old:
        new = old[: old.index(START)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    fd, tmp = tempfile.mkstemp(dir=HERE, prefix=".RESULTS.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)


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
    args = ap.parse_args()
    single, cmd1 = run_bench(args, args.methods, 1)
    batch, cmd2 = run_bench(args, args.batch_methods, args.concurrency)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_dspark.json").write_text(json.dumps(single, indent=2) + "\n")
    (HERE / "results" / "bench_dspark_batch.json").write_text(json.dumps(batch, indent=2) + "\n")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        "## DSpark drafters (part 2): dflash vs dspark_markov vs dspark_rnn, and the prefix scheduler\n\n"
        f"Measured {when} on {single['device']} ({platform.processor() or platform.machine()}), "
        f"{single['prompts']} held-out prompts (code from site-packages), {single['max_new_tokens']} new tokens "
        f"each, greedy, block size {args.block_size}, {args.repeats} interleaved repeats.\n\n"
        f"Command: `python benchmarks/bench_dspark.py` which runs\n`{cmd1}`\n\n{table(single)}\n\n"
        f"With {args.concurrency} requests in flight (`{cmd2}`):\n\n{table(batch)}\n\n"
        "Offline acceptance figures (per-position conditional acceptance, tau against gamma, STS ECE): "
        "`python benchmarks/dspark_acceptance.py` -> results/dspark_acceptance.{json,png}.\n"
    )
    write_section(text)
    print(text)


if __name__ == "__main__":
    main()
