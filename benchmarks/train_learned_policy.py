"""Train the committed verify-length policy for SmolLM2-135M's markov drafter on this CPU (`spec.scheduler: learned`).

Usage: python benchmarks/train_learned_policy.py [--out PATH] [--max-new-tokens 128] [--threads 2]
Needs `python cli.py models fetch smollm2-135m` and the committed markov drafter. All through the CLI:
1. round logs: `cli.py bench` with dspark_markov/verify_all (full information), bf16, block 8, on code and chat
   traffic mixed (held-out code prompts 16-23 interleaved with chat prompts 8-15), at concurrency 1, 8 and 16
   (two repeats at 16), spec.round_log set;
2. `cli.py train-policy` on the three logs with `--drop entropy`: on mixed traffic the request's rolling acceptance
   carries what the draft entropy would (RESULTS.md `learned_notes`), and a policy without it spares the drafter a
   softmax pass over the vocabulary per drafted position.
Writes dspark_core/assets/smollm2-135m/policy_cpu_bf16_markov.json (or --out). The policy is measured through
`serve` on the other prompts (code 0-7, chat 0-7): `python benchmarks/bench_learned_serve.py --traffic mixed`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
POLICY = ROOT / "dspark_core" / "assets" / "smollm2-135m" / "policy_cpu_bf16_markov.json"
LOADS = ((1, 1), (8, 1), (16, 2))  # (concurrency, repeats) of the logging runs


def cli(*argv: str) -> None:
    print("+ python cli.py " + shlex.join(argv), flush=True)
    if subprocess.run([sys.executable, "cli.py", *argv], cwd=ROOT, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"train_learned_policy: `cli.py {argv[0]}` failed (its error is above)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=POLICY)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="train_learned_policy."))
    code = (HERE / "prompts" / "heldout_code.jsonl").read_text().splitlines()
    chat = (HERE / "prompts" / "heldout_chat.jsonl").read_text().splitlines()
    prompts = work / "train_mixed.jsonl"
    prompts.write_text("".join(f"{x}\n{y}\n" for x, y in zip(code[16:24], chat[8:16], strict=True)))
    logs = []
    for c, repeats in LOADS:
        log, cfg = work / f"rounds_c{c}.jsonl", work / f"log_c{c}.yaml"
        cfg.write_text(f"spec:\n  round_log: {json.dumps(str(log))}\n")
        cli("bench", "--model", "smollm2-135m", "--dtype", "bf16", "--prompts", str(prompts), "--limit", "16",
            "--max-new-tokens", str(a.max_new_tokens), "--methods", "dspark_markov/verify_all", "--repeats",
            str(repeats), "--block-size", "8", "--threads", str(a.threads), "--concurrency", str(c), "--config",
            str(cfg), "--json")
        logs.append(str(log))
    cli("train-policy", *logs, "--out", str(a.out), "--drop", "entropy")
    print(f"wrote {a.out} (logs in {work})")


if __name__ == "__main__":
    main()
