"""The learned block length against static blocks on mixed code + chat traffic (SmolLM2-135M, bf16, this CPU).

Usage: python benchmarks/bench_gamma.py [--limit 8] [--train-prompts 8] [--max-new-tokens 128] [--repeats 2]
Needs `python cli.py models fetch smollm2-135m` and the committed SmolLM2 markov drafter. Runs, all through the CLI:
1. round logs of the deployment's own kind of traffic, as an operator would log it: code and chat prompts from the
   held-out sets (outside the drafters' training sources) that the evaluation below never sees (code prompts 16..,
   chat prompts 8..), interleaved, dspark_markov/verify_all@explore at block 8 (a seeded uniform block in 0..8 per
   round: every block length and plain steps on the same traffic, interleaved round by round so that drifting load on
   shared cores hits them alike; rounds at block 8 give full information), concurrency 1, 8 and 16 (a policy whose
   logs stop at 8 requests misprices drafting at 16: it lost there through `serve`); at 16 the logged prompts make
   one batch, so they are logged twice;
2. `cli.py train-gamma-policy` on the logs -> dspark_core/assets/smollm2-135m/gamma_cpu_bf16_markov.json;
3. `cli.py bench` on the first held-out code and chat prompts interleaved, concurrency 1 and 8: plain, static blocks
   2, 4, 8 and the learned block in one run each;
then writes results/smollm2_gamma.json and the RESULTS.md section between the `gamma` markers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from bench_learned import MODEL, bench, run
from results_md import bench_table, write_section

HERE = Path(__file__).parent
ROOT = HERE.parent
POLICY = ROOT / "dspark_core" / "assets" / MODEL / "gamma_cpu_bf16_markov.json"
BLOCKS = (2, 4, 8)
METHODS = ",".join(["plain", *(f"dspark_markov/verify_all@{b}" for b in BLOCKS), "dspark_markov/verify_all@learned"])
def mixed(code: list[dict], chats: list[dict], path: Path) -> Path:
    """Code and chat prompts interleaved (code, chat, code, ...), so every run and batch sees both."""
    rows = [r for pair in zip(code, chats, strict=False) for r in pair]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=8, help="evaluation prompts per domain (the first of each set)")
    ap.add_argument("--train-prompts", type=int, default=8, help="logged prompts per domain (code 16.., chat 8..)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,8", help="evaluated loads")
    ap.add_argument("--log-concurrency", default="1,8,16", help="logged loads (the policy's training data)")
    ap.add_argument("--skip-logs", type=Path, help="reuse the logs and policy of an earlier run's scratch folder")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    work = args.skip_logs or Path(tempfile.mkdtemp(prefix="bench_gamma."))
    logs = sorted(work.glob("rounds_*.jsonl"))
    code = [json.loads(x) for x in (HERE / "prompts" / "heldout_code.jsonl").read_text().splitlines()]
    chats = [json.loads(x) for x in (HERE / "prompts" / "heldout_chat.jsonl").read_text().splitlines()]
    if not args.limit <= 8 or not args.train_prompts <= min(len(code) - 16, len(chats) - 8):
        sys.exit("--limit must be <= 8 and --train-prompts <= 8: evaluation and logged prompts must not overlap")
    if not args.skip_logs:
        train = mixed(code[16: 16 + args.train_prompts], chats[8: 8 + args.train_prompts], work / "train.jsonl")
        for c in (int(x) for x in args.log_concurrency.split(",")):
            log = work / f"rounds_c{c}_explore.jsonl"
            cfg = work / f"log_c{c}.yaml"
            cfg.write_text(f"spec:\n  round_log: {json.dumps(str(log))}\n")
            bench(args, train, "dspark_markov/verify_all@explore", c, cfg, 2 * args.train_prompts,
                  max(1, c // 8), max(BLOCKS))
            logs.append(log)
    trained, train_cmd = run([sys.executable, "cli.py", "train-gamma-policy", *map(str, logs), "--out", str(POLICY),
                              "--json"], work)
    held = mixed(code[: args.limit], chats[: args.limit], work / "heldout_mixed.jsonl")
    cfg = work / "learned.yaml"
    cfg.write_text(f"spec:\n  gamma_policy_path: {json.dumps(str(POLICY))}\n")
    results = {c: bench(args, held, METHODS, c, cfg, 2 * args.limit, args.repeats, max(BLOCKS)) for c in levels}
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "train_gamma_policy": trained,
           **{f"c{c}": r for c, (r, _) in results.items()}}
    (HERE / "results" / "smollm2_gamma.json").write_text(json.dumps(out, indent=2) + "\n")
    statics = ", ".join(f"block {b} {trained[f'static_{b}']:.1f}" for b in range(max(BLOCKS) + 1))
    text = [f"## Learned block length vs static blocks, code + chat (SmolLM2-135M, bf16, this CPU, {out['date'][:10]})",
            "", "`python benchmarks/bench_gamma.py` ($WORK is its scratch folder: the training prompts, the round logs "
            "and the configs).", "",
            f"Policy trained on round logs of other held-out prompts (code 16.., chat 8..; `{train_cmd}`); held-out "
            "rounds priced on the logs "
            f"(tokens per modelled second; block 0 = plain decoding): {statics}; learned {trained['learned']:.1f} "
            f"(mean block {trained['mean_block_learned']:.2f}, plain in {trained['plain_share_learned']:.0%} of "
            f"rounds); per-round oracle {trained['oracle']:.1f}.", ""]
    for c, (r, shown) in results.items():
        text += [f"Concurrency {c}, held-out code and chat prompts interleaved: `{shown}`", "", bench_table(r), ""]
    write_section("gamma", "\n".join(text))
    for c, (r, _) in results.items():
        rate = {m["name"]: m["tokens_per_s"] for m in r["methods"]}
        best = max(BLOCKS, key=lambda b: rate[f"dspark_markov/verify_all@{b}"])
        print(f"c{c}: learned / best static (block {best}) = "
              f"{rate['dspark_markov/verify_all@learned'] / rate[f'dspark_markov/verify_all@{best}']:.3f}, "
              f"learned / plain = {rate['dspark_markov/verify_all@learned'] / rate['plain']:.3f}")


if __name__ == "__main__":
    main()
