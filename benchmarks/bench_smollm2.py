"""DSpark on a real pretrained target, SmolLM2-135M-Instruct, on this CPU: every method in one run per setting.

Usage: python benchmarks/bench_smollm2.py [--limit 8] [--max-new-tokens 128] [--repeats 2] [--skip-vllm]
Needs `python cli.py models fetch smollm2-135m` and the committed SmolLM2 drafters (docs/drafters.md). Runs:
1. the SPS table of the target in bf16 and fp32 (one row and 8 rows), saved as
   dspark_core/assets/smollm2-135m/sps_cpu_bf16.json (SGLang's SpsCostTable format);
2. `cli.py bench` in bf16 at concurrency 1 (plain, hf_assisted, hf_prompt_lookup, ar_draft, ngram, dflash,
   dspark_markov, dspark_rnn; --record-acceptance writes the drafters' measured acceptance for `profile`), and at
   concurrency 8 (the same plus the scheduler variants);
3. `cli.py bench` in fp32 at concurrency 1 (the lossless check: token-identical greedy outputs), and in bf16 on
   chat prompts (benchmarks/prompts/heldout_chat.jsonl; acceptance recorded for the chat domain);
4. vLLM's CPU build on the same checkpoint and prompts, plain and n-gram (benchmarks/peer_vllm_cpu.py);
then writes results/smollm2_*.json, the RESULTS.md section between the smollm2 markers, and the issue's checks.
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
MODEL = "smollm2-135m"
SINGLE = "plain,hf_assisted,hf_prompt_lookup,ar_draft,ngram,dflash,dspark_markov,dspark_rnn"
BATCH = (SINGLE + ",dspark_markov/threshold,dspark_markov/prefix,dspark_markov/async_topk,dspark_rnn/prefix,"
         "dflash/prefix")
LOSSLESS = "plain,ngram,ar_draft,dflash,dspark_markov,dspark_rnn,dspark_markov/prefix"
CHAT = "plain,ngram,dflash,dspark_markov,dspark_rnn"  # acceptance on chat (the drafters saw only code)


def bench(args: argparse.Namespace, methods: str, concurrency: int, dtype: str, max_new: int,
          record: bool = False, prompts: str | None = None, repeats: int | None = None) -> tuple[dict, str]:
    """One `cli.py bench` run -> (its JSON, the command as shown)."""
    cmd = [sys.executable, "cli.py", "bench", "--model", MODEL, "--dtype", dtype, "--prompts", prompts or args.prompts,
           "--limit", str(args.limit), "--max-new-tokens", str(max_new), "--methods", methods, "--repeats",
           str(repeats or args.repeats), "--block-size", str(args.block_size), "--threads", str(args.threads),
           "--concurrency", str(concurrency), "--json"]
    if record:
        cmd.append("--record-acceptance")
    shown = " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])
    print(f"+ {shown}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout), shown


def sps_tables(threads: int) -> dict:
    """Target steps/s against verify tokens (bf16 and fp32; 1 and 8 rows); the bf16 one-row table is saved."""
    import torch

    sys.path.insert(0, str(ROOT))
    from dspark_core.config import MODEL_ASSETS
    from dspark_core.modeling.checkpoint import load_model
    from dspark_core.verification.verify_scheduler import profile_target_sps

    torch.set_num_threads(threads)
    out: dict = {}
    for dtype in ("bf16", "fp32"):
        target = load_model(MODEL, "cpu", dtype)
        for rows, top in ((1, 17), (8, 72)):
            table = profile_target_sps(target, top, rows=rows, context=256, repeats=5)
            out[f"{dtype}_rows{rows}"] = table.to_dict()
            if dtype == "bf16" and rows == 1:
                table.save(MODEL_ASSETS / MODEL / "sps_cpu_bf16.json")
    return out


def ratio(table: dict, b: int, base: int) -> float:
    """Step time at b verify tokens over step time at `base` (from steps/s)."""
    toks, sps = table["sample_batch_tokens"], table["sample_steps_per_sec"]

    def at(n: int) -> float:
        i = max(j for j, t in enumerate(toks) if t <= n) if n >= toks[0] else 0
        return sps[i]

    return at(base) / at(b)


def best_dspark(result: dict) -> dict:
    return max((m for m in result["methods"] if m["name"].split("/")[0] in ("dflash", "dspark_markov", "dspark_rnn")),
               key=lambda m: m["tokens_per_s"])


def by_name(result: dict, name: str) -> dict | None:
    return next((m for m in result["methods"] if m["name"] == name), None)


def checks(single: dict, batch: dict, fp32: dict, vllm: dict | None) -> list[str]:
    """The issue's done-when conditions, each with what was measured."""
    out = []
    best = best_dspark(single)
    hf = [by_name(single, n) for n in ("hf_assisted", "hf_prompt_lookup")]
    fast_hf = max((m["tokens_per_s"] for m in hf if m), default=0.0)
    ok = best["speedup"] >= 2.5 and best["tokens_per_s"] > fast_hf
    out.append(f"{'PASS' if ok else 'FAIL'}: concurrency 1, bf16: best DSpark {best['name']} "
               f"{best['speedup']:.2f}x plain (>= 2.5x) and {best['tokens_per_s']:.1f} tok/s vs hf {fast_hf:.1f}")
    mk, df = by_name(single, "dspark_markov"), by_name(single, "dflash")
    if mk and df:
        out.append(f"{'PASS' if mk['tau'] >= 1.15 * df['tau'] else 'FAIL'}: tau(dspark_markov) {mk['tau']:.2f} vs "
                   f"1.15 x tau(dflash) {1.15 * df['tau']:.2f} at gamma {len(mk['position_acceptance'])}")
    bb = best_dspark(batch)
    pre, va = by_name(batch, "dspark_markov/prefix"), by_name(batch, "dspark_markov")
    out.append(f"{'PASS' if bb['speedup'] > 1 else 'FAIL'}: concurrency 8: best DSpark {bb['name']} "
               f"{bb['speedup']:.2f}x plain")
    if pre and va:
        out.append(f"{'PASS' if pre['tokens_per_s'] >= va['tokens_per_s'] else 'FAIL'}: concurrency 8: prefix "
                   f"{pre['tokens_per_s']:.1f} tok/s vs verify_all {va['tokens_per_s']:.1f}")
    if vllm:
        ng = next(m for m in vllm["methods"] if m["name"] == "ngram")
        out.append(f"{'PASS' if best['speedup'] > ng['speedup'] else 'FAIL'}: our speedup {best['speedup']:.2f}x vs "
                   f"vLLM-CPU n-gram {ng['speedup']:.2f}x over its plain")
        ours = by_name(single, "ngram")
        if ours:  # the same method in both engines: what the engine adds, apart from the drafter
            out.append(f"{'PASS' if ours['speedup'] > ng['speedup'] else 'FAIL'} (same method): our n-gram "
                       f"{ours['speedup']:.2f}x vs vLLM-CPU n-gram {ng['speedup']:.2f}x, each over its own plain")
    lossy = [m["name"] for m in fp32["methods"] if m["lossless"] is False]
    out.append(f"{'PASS' if not lossy else 'FAIL'}: fp32 greedy token-identical for every method"
               + (f" (not: {', '.join(lossy)})" if lossy else ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="benchmarks/prompts/heldout_code.jsonl")
    ap.add_argument("--chat-prompts", default="benchmarks/prompts/heldout_chat.jsonl")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    sps = sps_tables(args.threads)
    single, cmd1 = bench(args, SINGLE, 1, "bf16", args.max_new_tokens, record=True)
    batch, cmd8 = bench(args, BATCH, 8, "bf16", args.max_new_tokens)
    fp32, cmd32 = bench(args, LOSSLESS, 1, "fp32", 64, repeats=1)  # the identity check: one pass is enough
    chat, cmdc = bench(args, CHAT, 1, "bf16", args.max_new_tokens, record=True, prompts=args.chat_prompts, repeats=1)
    vllm, vcmd = None, ""
    if not args.skip_vllm:
        out = HERE / "results" / "smollm2_vllm_cpu.json"
        vargs = ["--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens), "--dtype", "bf16",
                 "--k", str(args.block_size), "--threads", str(args.threads), "--repeats", str(args.repeats)]
        vcmd = "python benchmarks/peer_vllm_cpu.py " + " ".join(vargs)
        print(f"+ {vcmd}", flush=True)
        if subprocess.run([sys.executable, str(HERE / "peer_vllm_cpu.py"), *vargs, "--out", str(out)],
                          cwd=ROOT).returncode == 0:
            vllm = json.loads(out.read_text())
    res = HERE / "results"
    for name, data in (("smollm2_sps", sps), ("smollm2_c1", single), ("smollm2_c8", batch), ("smollm2_fp32", fp32),
                       ("smollm2_chat", chat)):
        (res / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t = sps["bf16_rows1"]
    t32 = sps["fp32_rows1"]
    vtext = ""
    if vllm:
        vtext = ("vLLM's CPU build (vllm-cpu " + vllm["vllm_version"] + ") on the same checkpoint and prompts, bf16, "
                 f"one request at a time (`{vcmd}`):\n\n| method | tokens/s | speedup over its plain | identical to "
                 "its plain |\n|---|---:|---:|---:|\n" + "".join(
                     f"| vllm-cpu {m['name']} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}x | "
                     f"{m['identical_to_plain']:.0%} |\n" for m in vllm["methods"]) + "\n")
    lines = checks(single, batch, fp32, vllm)
    import torch

    text = (
        "## SmolLM2-135M-Instruct (a real pretrained target) on this CPU: DSpark against plain, transformers and "
        "vLLM-CPU\n\n"
        f"Measured {when} on {single['device']} ({platform.processor() or platform.machine()}, capability "
        f"**{torch.backends.cpu.get_cpu_capability()}**, oneDNN bf16 "
        f"{'native' if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 'not native'}), "
        f"{single['prompts']} held-out code prompts (site-packages, never trained on), {single['max_new_tokens']} new "
        f"tokens, greedy, block size {args.block_size}, {args.repeats} interleaved repeats. Command: "
        "`python benchmarks/bench_smollm2.py`.\n\n"
        f"Verify cost (SPS table, one request, 256-token context): a step over 9 tokens costs "
        f"{ratio(t, 9, 1):.2f}x one token in bf16 and {ratio(t32, 9, 1):.2f}x in fp32; 17 tokens "
        f"{ratio(t, 17, 1):.2f}x / {ratio(t32, 17, 1):.2f}x (results/smollm2_sps.json; the bf16 table ships as "
        "dspark_core/assets/smollm2-135m/sps_cpu_bf16.json).\n\n"
        f"Concurrency 1, bf16 (`{cmd1}`):\n\n{bench_table(single)}\n\n"
        f"Concurrency 8, bf16 (`{cmd8}`; transformers' assisted generation takes one request at a time):\n\n"
        f"{bench_table(batch)}\n\n"
        f"Float32, concurrency 1, 64 new tokens (`{cmd32}`):\n\n{bench_table(fp32)}\n\n"
        f"Chat prompts (SmolLM2's chat template; the drafters were trained on code only), bf16, concurrency 1 "
        f"(`{cmdc}`):\n\n{bench_table(chat)}\n\n" + vtext
        + "Checks:\n\n" + "".join(f"- {c}\n" for c in lines)
    )
    write_section("smollm2", text)
    print(text)


if __name__ == "__main__":
    main()
