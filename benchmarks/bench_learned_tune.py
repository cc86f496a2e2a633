"""`tune` choosing the learned verify length and block length (SmolLM2-135M, bf16 drafters, this CPU, measure mode).

Usage: python benchmarks/bench_learned_tune.py [--trials 16] [--concurrency 8] [--repeats 3] [--write]
Needs `python cli.py models fetch smollm2-135m` and the committed SmolLM2 drafters and policies. Runs:
1. `cli.py profile` of SmolLM2 on this CPU (`--gpu cpu`: measure mode) with held-out code and chat prompts
   interleaved as the workload (code 0.., chat 0..; the policies were trained on other prompts), `--concurrency`
   clients, no SLOs: the profile finds the committed policies (drafter.verify_policy / gamma_policy) and the rules
   put `learned` into spec.scheduler's and spec.gamma_policy's search space;
2. `cli.py tune --trials N` on it: every trial a real engine run of the workload's first 8 prompts;
3. the exported bundle's dspark.yaml through `cli.py generate` (it must run as shipped, with its policy files);
4. the best trial against itself with each learned choice switched to its static counterpart (scheduler -> prefix,
   gamma_policy -> static) and against plain decoding, measured interleaved, `--repeats` passes, by the measure
   evaluator the study used;
then writes results/smollm2_learned_tune.json and, with --write, the RESULTS.md `learned_tune` section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from bench_gamma import mixed
from bench_learned import MODEL
from results_md import write_section

HERE = Path(__file__).parent
ROOT = HERE.parent
SHOWN = ("spec.scheduler", "spec.gamma_policy", "spec.head", "spec.block_size", "batch.max_requests", "kv.dtype",
         "weights.dtype", "spec.confidence_threshold", "spec.fallback_acceptance")


def cli(args: list[str], env: dict[str, str]) -> str:
    print("+ python cli.py " + " ".join(args), flush=True)
    proc = subprocess.run([sys.executable, "cli.py", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"cli.py {args[0]} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def trials(url: str, study: str) -> list[dict]:
    import optuna

    from tuner.storage import storage
    from tuner.study import SPEC_ATTR, StudySpec

    st = optuna.load_study(study_name=study, storage=storage(url))
    space = StudySpec.model_validate(st.user_attrs[SPEC_ATTR]).space()
    out = []
    for t in st.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        out.append({"number": t.number, "params": space.params_of(dict(t.params)),
                    "metrics": dict(t.user_attrs.get("metrics", {})), "feasible": t.user_attrs.get("feasible", True),
                    "why": t.user_attrs.get("why", "")})
    return out


def variants(best: dict) -> dict[str, dict]:
    """The best trial and each of its learned choices switched to the static counterpart."""
    out = {"best": best}
    if best.get("spec.scheduler") == "learned":
        out["scheduler=prefix"] = {**best, "spec.scheduler": "prefix"}
    if best.get("spec.gamma_policy") == "learned":
        out["gamma_policy=static"] = {**best, "spec.gamma_policy": "static"}
    if len(out) == 3:
        out["both static"] = {**best, "spec.scheduler": "prefix", "spec.gamma_policy": "static"}
    if len(out) == 1:  # the tuner chose neither: measure what switching them on would have done
        out["scheduler=learned"] = {**best, "spec.scheduler": "learned"}
        out["gamma_policy=learned"] = {**best, "spec.gamma_policy": "learned"}
    out["plain decoding"] = {**best, "spec.enabled": False}  # what the deployment would do without speculation
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write the RESULTS.md section")
    ap.add_argument("--render", type=Path, help="only write the RESULTS.md section of this earlier results JSON")
    args = ap.parse_args()
    if args.render:
        write_section("learned_tune", render(json.loads(args.render.read_text()), args))
        return
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench_learned_tune."))
    url = f"sqlite:///{work / 'kb.sqlite'}"
    env = {**os.environ, "DSPARK_DB": url}
    def load(name: str) -> list[dict]:  # a workload file takes prompt and domain only
        rows = [json.loads(x) for x in (HERE / "prompts" / name).read_text().splitlines()]
        return [{"prompt": r["prompt"], "domain": r["domain"]} for r in rows]

    code, chats = load("heldout_code.jsonl"), load("heldout_chat.jsonl")
    prompts = mixed(code[:8], chats[:8], work / "heldout_mixed.jsonl")
    prof = ["profile", "--model", MODEL, "--gpu", "cpu", "--workload", str(prompts), "--concurrency",
            str(args.concurrency), "--slo-ttft-ms", "0", "--slo-tpot-ms", "0", "--json"]
    profile = json.loads(cli(prof, env))
    bundle = work / "bundle"
    tune = ["tune", "--trials", str(args.trials), "--seed", str(args.seed), "--study", "learned", "--out", str(bundle),
            "--json"]
    summary = json.loads(cli(tune, env))
    rows = trials(url, "learned")
    cfg = bundle / "dspark.yaml"
    gen = json.loads(cli(["generate", "--config", str(cfg), "--prompts", str(prompts), "--max-new-tokens", "48",
                          "--json"], env))

    import torch

    from profiler.schema import Profile
    from tuner.measure import MeasureEvaluator
    from tuner.space import engine_defaults

    torch.set_num_threads(2)
    best = {**engine_defaults(), **summary["params"]}
    ev = MeasureEvaluator(Profile.model_validate(profile), dtype=None)
    arms = variants(best)
    measured: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(args.repeats):  # interleaved: drifting load on shared cores hits every arm alike
        for name, params in arms.items():
            e = ev.evaluate(params)
            measured[name].append(e.metrics.get("throughput", 0.0) if e.feasible else 0.0)
            print(f"  {name}: {measured[name][-1]:.1f} tok/s", flush=True)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "profile_drafter": profile["drafter"],
              "commands": {"profile": prof, "tune": tune}, "summary": summary, "trials": rows,
              "bundle_generate": gen.get("stats", gen), "arms": {k: {"params": {p: arms[k][p] for p in SHOWN},
                                                                      "tok_s": v} for k, v in measured.items()}}
    out = HERE / "results" / "smollm2_learned_tune.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {out}")
    if args.write:
        write_section("learned_tune", render(result, args))


def render(r: dict, args: argparse.Namespace) -> str:
    lines = ["## `tune` choosing the learned policies (SmolLM2-135M, this CPU, measure mode)", "",
             f"`python benchmarks/bench_learned_tune.py --trials {args.trials} --concurrency {args.concurrency} "
             f"--repeats {args.repeats} --write` ({r['date']}): profile `--gpu cpu` with held-out code and chat "
             f"prompts interleaved as the workload, {args.concurrency} clients, no SLOs; the profile found "
             f"`{Path(r['profile_drafter'].get('verify_policy') or '-').name}` and "
             f"`{Path(r['profile_drafter'].get('gamma_policy') or '-').name}`. Every trial: the workload's first 8 "
             "prompts, 48 new tokens, the real engine.", "",
             "| trial | " + " | ".join(p.removeprefix("spec.").removeprefix("batch.") for p in SHOWN)
             + " | tok/s | tau |",
             "|---:|" + "---|" * len(SHOWN) + "---:|---:|"]
    for t in r["trials"]:
        p, m = t["params"], t["metrics"]
        cells = [str(p.get(k, "")) if not isinstance(p.get(k), float) else f"{p[k]:.2f}" for k in SHOWN]
        tok = f"{m['throughput']:.1f}" if "throughput" in m else f"- ({t['why'][:60]})"
        lines.append(f"| {t['number']} | " + " | ".join(cells) + f" | {tok} | {m.get('tau', 0):.2f} |")
    s = r["summary"]
    lines += ["", f"Exported trial {s['trial']}; its dspark.yaml through `cli.py generate` as shipped (policy files "
              f"beside it; all 16 prompts): {r['bundle_generate'].get('tokens_per_s', 0):.1f} tok/s, "
              f"tau {r['bundle_generate'].get('tau', 0):.2f}.", "",
              "The best trial against its learned choices switched off, interleaved "
              f"({args.repeats} passes each, same evaluator):", "", "| arm | tok/s per pass | median | vs best |",
              "|---|---|---:|---:|"]
    med = {k: statistics.median(v["tok_s"]) for k, v in r["arms"].items()}
    for k, v in r["arms"].items():
        lines.append(f"| {k} | {', '.join(f'{x:.1f}' for x in v['tok_s'])} | {med[k]:.1f} | "
                     f"{med[k] / med['best']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
