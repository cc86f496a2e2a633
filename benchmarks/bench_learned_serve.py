"""The learned verify-length policy against Algorithm 1 through `serve`, bursty arrivals, concurrency 1, 8 and 16.

Usage: python benchmarks/bench_learned_serve.py [--policy PATH] [--loads 1,8,16] [--passes 2] [--max-tokens 96]
Needs `python cli.py models fetch smollm2-135m`, the committed markov drafter and a trained policy (default: the one
benchmarks/bench_learned.py writes). Per load c: two servers (spec.scheduler prefix and learned, batch.max_requests
c, bf16, block 8), and one open-loop plan of 3c + 4 held-out code requests whose Poisson arrivals alternate a burst
(2c requests/s for 2 s) with a lull (0.2/s for 6 s), so the queue fills and drains. Passes alternate the two servers
on the same plan; the table gives output tokens/s over each pass (first arrival to last token) and p99 TPOT / TTFT.
Writes results/smollm2_learned_serve.json and the RESULTS.md section between the `learned_serve` markers.
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

from benchmarks.results_md import write_section  # noqa: E402

SCHEDULERS = ("prefix", "learned")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path,
                    default=ROOT / "dspark_core" / "assets" / "smollm2-135m" / "policy_cpu_bf16_markov.json")
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout_code.jsonl")
    ap.add_argument("--loads", default="1,8,16")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    from dspark_core.cli.prompts import load_prompts
    from dspark_core.config import EngineConfig, save_config
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from live.loadgen import Target, run
    from live.traffic import Planned, poisson_arrivals
    from tests.serving import Server

    if not a.policy.is_file():
        sys.exit(f"no policy at {a.policy}: run benchmarks/bench_learned.py first or pass --policy")
    tmp = Path(tempfile.mkdtemp(prefix="bench-learned-serve-"))
    texts = [r.prompt for r in load_prompts(a.prompts)]
    results: dict[str, dict] = {}
    for c in (int(x) for x in a.loads.split(",")):
        n = 3 * c + 4
        plan = [Planned(i, texts[i % len(texts)], a.max_tokens) for i in range(n)]
        arrivals = poisson_arrivals([(2.0 * c, 2.0), (0.2, 6.0)], n, seed=c)
        servers = {}
        for name in SCHEDULERS:
            cfg = EngineConfig(device="cpu")
            cfg.drafter.method, cfg.spec.head, cfg.spec.scheduler = "dspark", "markov", name  # type: ignore[assignment]
            cfg.model.path, cfg.weights.dtype = str(checkpoint_folder("smollm2-135m")), "bf16"
            cfg.spec.block_size, cfg.model.max_seq_len, cfg.batch.max_requests = 8, 1024, c
            cfg.spec.policy_path = str(a.policy.resolve()) if name == "learned" else None
            servers[name] = Server(save_config(cfg, tmp / f"{name}_c{c}.yaml"), "--threads", str(a.threads),
                                   "--static")
        try:
            targets = {k: Target.parse(s.url, None) for k, s in servers.items()}
            for t in targets.values():
                run(t, plan[: min(c, 2)], None, c, 600.0, 0.0, True)  # warm-up
            passes: dict[str, list[dict]] = {k: [] for k in SCHEDULERS}
            for p in range(a.passes):
                for name in (SCHEDULERS if p % 2 == 0 else SCHEDULERS[::-1]):
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
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "policy": str(a.policy),
           "max_tokens": a.max_tokens, "results": results}
    (ROOT / "benchmarks" / "results" / "smollm2_learned_serve.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"## Learned verify length through `serve`, bursty arrivals (SmolLM2-135M, bf16, {out['date'][:10]})", "",
             f"`python benchmarks/bench_learned_serve.py --loads {a.loads} --passes {a.passes} --max-tokens "
             f"{a.max_tokens} --threads {a.threads}`: medians over passes (alternating servers, same plan).", "",
             "| load | scheduler | tokens/s | learned / prefix | mean TPOT ms | p99 TPOT ms | p99 TTFT ms |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for load, res in results.items():
        ratio = res["learned"]["tokens_per_s"] / res["prefix"]["tokens_per_s"]
        for name in SCHEDULERS:
            r = res[name]
            lines.append(f"| {load} | {name} | {r['tokens_per_s']:.1f} | {ratio:.3f} | {r['mean_tpot_ms']:.0f} | "
                         f"{r['p99_tpot_ms']:.0f} | {r['p99_ttft_ms']:.0f} |")
    write_section("learned_serve", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
