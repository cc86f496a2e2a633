"""The learned policies through `serve`, bursty arrivals, concurrency 1, 8 and 16.

Usage: python benchmarks/bench_learned_serve.py [--arms verify|gamma] [--loads 1,8,16] [--passes 2] [--max-tokens 96]
       [--traffic code|mixed]
Needs `python cli.py models fetch smollm2-135m`, the committed markov drafter and its policies (benchmarks/
bench_learned.py and bench_gamma.py write them). `--arms verify` (the learned verify length against Algorithm 1):
servers with spec.scheduler prefix and learned at block 8, on held-out code prompts (`--traffic mixed`: code and chat,
as for gamma). `--arms gamma` (the learned block length against static blocks): plain decoding, blocks 2 and 4 (the
best static blocks of the closed-batch runs) and the learned block within 8, all verify_all, on held-out code and chat
prompts interleaved (code 0-7, chat 0-7; the policies were trained on others). Per load c: every arm's server
(batch.max_requests c, bf16), and one open-loop plan of 3c + 4 requests whose Poisson arrivals alternate a burst (2c
requests/s for 2 s) with a lull (0.2/s for 6 s), so the queue fills and drains. Passes cycle the servers on the same
plan, in reversed order every other pass; the table gives output tokens/s over each pass (first arrival to last token)
and p99 TPOT / TTFT. Writes results/smollm2_learned_serve.json (verify) or smollm2_gamma_serve.json (gamma) and the
RESULTS.md section between the `learned_serve` / `gamma_serve` markers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_md import shown_command, write_section  # noqa: E402

ASSETS = ROOT / "dspark_core" / "assets" / "smollm2-135m"
PROMPTS = ROOT / "benchmarks" / "prompts"
# arm -> engine settings (spec.enabled, scheduler, block, gamma_policy); `learned` is compared with the others
ARMS = {
    "verify": {"prefix": (True, "prefix", 8, "static"), "learned": (True, "learned", 8, "static")},
    "gamma": {"plain": (False, "verify_all", 8, "static"), "block 2": (True, "verify_all", 2, "static"),
              "block 4": (True, "verify_all", 4, "static"), "learned": (True, "verify_all", 8, "learned")},
}
SECTION = {"verify": "learned_serve", "gamma": "gamma_serve"}


def prompts(arms: str, first: int | None, traffic: str) -> list[str]:
    """Held-out code prompts (verify, code traffic; the first `first` only, when a policy was trained on the others),
    or code and chat interleaved (gamma, and verify with mixed traffic): code 0-7 and chat 0-7."""
    from dspark_core.cli.prompts import load_prompts

    code = [r.prompt for r in load_prompts(PROMPTS / "heldout_code.jsonl")]
    if arms == "verify" and traffic == "code":
        return code[:first]
    chat = [r.prompt for r in load_prompts(PROMPTS / "heldout_chat.jsonl")]
    return [t for pair in zip(code[:8], chat[:8], strict=True) for t in pair]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", choices=tuple(ARMS), default="verify")
    ap.add_argument("--policy", type=Path, default=ASSETS / "policy_cpu_bf16_markov.json")
    ap.add_argument("--gamma-policy", type=Path, default=ASSETS / "gamma_cpu_bf16_markov.json")
    ap.add_argument("--loads", default="1,8,16")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--first", type=int, help="verify: only the first N held-out code prompts (the policy was "
                    "trained on logs of the others)")
    ap.add_argument("--traffic", choices=("code", "mixed"), default="code",
                    help="verify: held-out code prompts, or code and chat interleaved as for --arms gamma")
    ap.add_argument("--tag", default="", help="a variant's own results file, RESULTS.md section (name_TAG) and title")
    a = ap.parse_args()
    a.command = shown_command("benchmarks/bench_learned_serve.py")

    from dspark_core.config import EngineConfig, save_config
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from live.loadgen import Target, run
    from live.traffic import Planned, poisson_arrivals
    from tests.serving import Server

    policy = a.policy if a.arms == "verify" else a.gamma_policy
    if not policy.is_file():
        sys.exit(f"no policy at {policy}: run benchmarks/bench_learned.py / bench_gamma.py first or pass it")
    arms = ARMS[a.arms]
    tmp = Path(tempfile.mkdtemp(prefix="bench-learned-serve-"))
    texts = prompts(a.arms, a.first, a.traffic)
    results: dict[str, dict] = {}
    for c in (int(x) for x in a.loads.split(",")):
        n = 3 * c + 4
        plan = [Planned(i, texts[i % len(texts)], a.max_tokens) for i in range(n)]
        arrivals = poisson_arrivals([(2.0 * c, 2.0), (0.2, 6.0)], n, seed=c)
        servers = {}
        for name, (enabled, scheduler, block, gamma_policy) in arms.items():
            cfg = EngineConfig(device="cpu")
            cfg.drafter.method = "dspark" if enabled else "plain"
            cfg.spec.enabled, cfg.spec.head, cfg.spec.scheduler = enabled, "markov", scheduler  # type: ignore[assignment]
            cfg.model.path, cfg.weights.dtype = str(checkpoint_folder("smollm2-135m")), "bf16"
            cfg.spec.block_size, cfg.model.max_seq_len, cfg.batch.max_requests = block, 1024, c
            cfg.spec.gamma_policy = gamma_policy  # type: ignore[assignment]
            cfg.spec.policy_path = str(a.policy.resolve()) if scheduler == "learned" else None
            cfg.spec.gamma_policy_path = str(a.gamma_policy.resolve()) if gamma_policy == "learned" else None
            servers[name] = Server(save_config(cfg, tmp / f"{name.replace(' ', '')}_c{c}.yaml"), "--threads",
                                   str(a.threads), "--static")
        try:
            targets = {k: Target.parse(s.url, None) for k, s in servers.items()}
            for t in targets.values():
                run(t, plan[: min(c, 2)], None, c, 600.0, 0.0, True)  # warm-up
            passes: dict[str, list[dict]] = {k: [] for k in arms}
            for p in range(a.passes):
                for name in (list(arms) if p % 2 == 0 else list(arms)[::-1]):
                    recs, secs = run(targets[name], plan, arrivals, c, 1800.0, 0.0, True)
                    ok = [r for r in recs if r.complete]
                    if len(ok) != len(recs):
                        sys.exit(f"c{c} {name}: {len(recs) - len(ok)} requests failed")
                    tpot = sorted((r.latency_s - r.ttft_s) / (r.completion_tokens - 1) for r in ok)
                    ttft = sorted(r.ttft_s for r in ok)
                    row = {"tokens_per_s": sum(r.completion_tokens for r in ok) / secs, "seconds": secs,
                           "p99_tpot_ms": 1e3 * tpot[min(len(tpot) - 1, round(0.99 * (len(tpot) - 1)))],
                           "mean_tpot_ms": 1e3 * statistics.fmean(tpot),
                           "p99_ttft_ms": 1e3 * ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))]}
                    passes[name].append(row)
                    print(f"c{c} pass {p} {name}: {row['tokens_per_s']:.1f} tok/s, p99 TPOT "
                          f"{row['p99_tpot_ms']:.0f} ms", flush=True)
        finally:
            for s in servers.values():
                s.stop()
        results[f"c{c}"] = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} | {"passes": v}
                            for k, v in passes.items()}
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "arms": a.arms, "policy": str(policy),
           "max_tokens": a.max_tokens, "results": results}
    tag = f"_{a.tag}" if a.tag else ""
    name = ("smollm2_learned_serve" if a.arms == "verify" else "smollm2_gamma_serve") + tag + ".json"
    (ROOT / "benchmarks" / "results" / name).write_text(json.dumps(out, indent=2) + "\n")
    lines = render(out, a)
    write_section(SECTION[a.arms] + tag, "\n".join(lines))
    print("\n".join(lines))


def render(out: dict, a: argparse.Namespace) -> list[str]:
    what = "verify length" if a.arms == "verify" else "block length"
    others = [k for k in ARMS[a.arms] if k != "learned"]
    spec = [k for k in others if ARMS[a.arms][k][0]]  # the speculative arms learned is measured against
    label = "learned / prefix" if a.arms == "verify" else "learned / best static block"
    variant = f", {a.tag}" if a.tag else ""
    lines = [f"## Learned {what} through `serve`, bursty arrivals (SmolLM2-135M, bf16{variant}, {out['date'][:10]})",
             "",
             f"`{a.command}`: medians over passes (servers cycled, same plan).",
             "",
             f"| load | arm | tokens/s | {label} | mean TPOT ms | p99 TPOT ms | p99 TTFT ms |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for load, res in out["results"].items():
        ratio = res["learned"]["tokens_per_s"] / max(res[k]["tokens_per_s"] for k in spec)
        for name in ARMS[a.arms]:
            r = res[name]
            lines.append(f"| {load} | {name} | {r['tokens_per_s']:.1f} | {ratio:.3f} | {r['mean_tpot_ms']:.0f} | "
                         f"{r['p99_tpot_ms']:.0f} | {r['p99_ttft_ms']:.0f} |")
    return lines


if __name__ == "__main__":
    main()
