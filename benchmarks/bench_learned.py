"""The learned verification-length policy against Algorithm 1 on SmolLM2-135M, this CPU (issue: learned lambda).

Usage: python benchmarks/bench_learned.py [--limit 8] [--train-prompts 16] [--max-new-tokens 128] [--repeats 2]
Needs `python cli.py models fetch smollm2-135m` and the committed SmolLM2 markov drafter. Runs, all through the CLI:
1. round logs: `cli.py bench` with dspark_markov/verify_all (full information) on standard-library prompts (the
   drafters' training distribution, never the held-out prompts) at concurrency 1 and 8, spec.round_log set;
2. `cli.py train-policy` on both logs -> $WORK/policy.json (the committed policy_cpu_bf16_markov.json is
   benchmarks/train_learned_policy.py's, trained on mixed code and chat logs);
3. `cli.py bench` on the held-out code prompts at concurrency 1 and 8: plain, dspark_markov/verify_all, /prefix and
   /learned in one run each;
then writes results/smollm2_learned.json and the RESULTS.md section between the `learned` markers.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from results_md import bench_table, write_section

HERE = Path(__file__).parent
ROOT = HERE.parent
MODEL = "smollm2-135m"
METHODS = "plain,dspark_markov/verify_all,dspark_markov/prefix,dspark_markov/learned"


def run(cmd: list[str], work: Path | None = None) -> tuple[dict, str]:
    shown = " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])
    shown = shown.replace(f"{ROOT}/", "").replace(str(work or "/nonexistent"), "$WORK")
    print(f"+ {shown}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout), shown


def bench(args: argparse.Namespace, prompts: Path, methods: str, concurrency: int, config: Path, limit: int,
          repeats: int, block: int = 8) -> tuple[dict, str]:
    return run([sys.executable, "cli.py", "bench", "--model", MODEL, "--dtype", "bf16", "--prompts", str(prompts),
                "--limit", str(limit), "--max-new-tokens", str(args.max_new_tokens), "--methods", methods,
                "--repeats", str(repeats), "--block-size", str(block), "--threads", str(args.threads), "--concurrency",
                str(concurrency), "--config", str(config), "--json"], config.parent)


def train_prompts(n: int, path: Path) -> Path:
    """n windows of standard-library code (the drafters' training sources), one per file, spread over the library."""
    sys.path.insert(0, str(ROOT))
    from dspark_core.training.build_tiny import is_heldout, stdlib_sources

    files = [p for p in stdlib_sources() if not is_heldout(p) and p.stat().st_size > 4000]
    step = max(1, len(files) // n)
    lines = []
    for p in files[::step][:n]:
        text = p.read_text(encoding="utf-8", errors="replace")
        mid = len(text) // 3
        lines.append(json.dumps({"prompt": text[mid: mid + 1200], "domain": "code"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=8, help="held-out prompts per bench run")
    ap.add_argument("--train-prompts", type=int, default=16, help="standard-library prompts per logging run")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default=str(HERE / "prompts" / "heldout_code.jsonl"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_learned."))
    train = train_prompts(args.train_prompts, work / "train.jsonl")
    logs = []
    for c in (1, 8):
        log = work / f"rounds_c{c}.jsonl"
        cfg = work / f"log_c{c}.yaml"
        cfg.write_text(f"spec:\n  round_log: {json.dumps(str(log))}\n")
        bench(args, train, "dspark_markov/verify_all", c, cfg, args.train_prompts, 1)
        logs.append(log)
    policy = work / "policy.json"
    trained, train_cmd = run([sys.executable, "cli.py", "train-policy", *map(str, logs), "--out", str(policy),
                              "--json"], work)
    cfg = work / "learned.yaml"
    cfg.write_text(f"spec:\n  policy_path: {json.dumps(str(policy))}\n")
    results = {}
    for c in (1, 8):
        results[c] = bench(args, Path(args.prompts), METHODS, c, cfg, args.limit, args.repeats)
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "train_policy": trained,
           **{f"c{c}": r for c, (r, _) in results.items()}}
    (HERE / "results" / "smollm2_learned.json").write_text(json.dumps(out, indent=2) + "\n")
    text = [f"## Learned verification length vs Algorithm 1 (SmolLM2-135M, bf16, this CPU, {out['date'][:10]})", "",
            "`python benchmarks/bench_learned.py` ($WORK is its scratch folder: the standard-library prompts, the "
            "round logs and the configs).", "",
            f"Policy trained on round logs of standard-library prompts (`{train_cmd}`): held-out rounds priced on the "
            f"log: verify_all {trained['verify_all']:.1f}, prefix {trained['prefix']:.1f}, learned "
            f"{trained['learned']:.1f}, oracle (each round's acceptance known) {trained['oracle']:.1f} tokens per "
            f"modelled second.", ""]
    for c, (r, shown) in results.items():
        text += [f"Concurrency {c}: `{shown}`", "", bench_table(r), ""]
    write_section("learned", "\n".join(text))
    for c, (r, _) in results.items():
        rate = {m["name"]: m["tokens_per_s"] for m in r["methods"]}
        print(f"c{c}: learned / prefix = {rate['dspark_markov/learned'] / rate['dspark_markov/prefix']:.3f}")


if __name__ == "__main__":
    main()
