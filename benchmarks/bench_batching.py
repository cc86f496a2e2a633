"""Dynamic batching under bursts (issue 19): `serve --adaptive` against `serve --static` on the same arrivals.

Both serve one engine config (a tuned-looking one: batching timeout bound `--timeout-ms`, DSpark drafter).
loadgen replays one Poisson arrival sequence whose rate switches between a calm and a burst phase; each
request streams `--max-tokens` tokens (ignore_eos, greedy). Static keeps the config's values: it waits the
timeout whenever an idle engine's batch is not full and always drafts the full block. Adaptive waits only
when the predicted gap to the next arrival is shorter than the bound, and runs the engine-wide block length
that maximises committed tokens per second at the current batch under the SPS table and the measured
acceptance (dspark_core/serving/batcher.py). Runs alternate (static, adaptive, static, ...) so drift on these
shared cores hits both; reported per run and as medians.

    python benchmarks/bench_batching.py [--rate 3@6,30@3] [--duration 27] [--repeats 2] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_md import write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="3@6,30@3", help="loadgen phases RATE@SECONDS, cycled")
    ap.add_argument("--duration", type=float, default=27.0, help="seconds of arrivals per run")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8, help="batch.max_requests")
    ap.add_argument("--timeout-ms", type=float, default=20.0, help="batch.timeout_ms (the tuned bound)")
    ap.add_argument("--block", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", help="a fetched model (smollm2-135m) in bf16 with its committed DSpark markov drafter "
                                    "instead of the tiny target")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()

    from dspark_core.config import EngineConfig, save_config
    from live.loadgen import Run, Target, run
    from live.traffic import parse_rate, plan_requests, poisson_arrivals
    from tests.serving import Server, scrape

    cfg = EngineConfig(device="cpu")
    cfg.drafter.method, cfg.spec.head, cfg.spec.block_size = "dspark", "markov", a.block
    cfg.batch.max_requests, cfg.batch.timeout_ms = a.slots, a.timeout_ms
    cfg.model.max_seq_len = 512
    if a.model:
        from dspark_core.modeling.checkpoint import checkpoint_folder

        cfg.model.path, cfg.weights.dtype = str(checkpoint_folder(a.model)), "bf16"
    config = save_config(cfg, Path(tempfile.mkdtemp(prefix="bench-batching-")) / "dspark.yaml")
    phases = parse_rate(a.rate)
    n = int(sum(r * s for r, s in phases) / sum(s for _, s in phases) * a.duration * 1.5) + 10
    plan = plan_requests("code", n, a.max_tokens, seed=0)
    arrivals = poisson_arrivals(phases, n, seed=0)
    rows: list[tuple[str, dict, dict]] = []
    for i in range(a.repeats):
        for mode in ("static", "adaptive"):
            s = Server(config, f"--{mode}", "--threads", str(a.threads), "--max-waiting", "1000")
            try:
                target = Target.parse(s.url, None)
                run(target, plan[:8], None, 4, 60.0, 0.0, True)  # warm-up
                before = scrape(s)
                recs, wall = run(target, plan, arrivals, 0, a.duration, 0.0, True)
                after = scrape(s)
            finally:
                s.stop()
            summ = Run(s.url, target.model, "code", f"rate {a.rate}", wall, recs).summary()
            m = {"switches": after.get(("dspark:block_length_switches", ""), 0.0),
                 "fallback_steps": None, "tau": None}
            drafts = after.get(("vllm:spec_decode_num_drafts_total", ""), 0) - before.get(
                ("vllm:spec_decode_num_drafts_total", ""), 0)
            acc = after.get(("vllm:spec_decode_num_accepted_tokens_total", ""), 0) - before.get(
                ("vllm:spec_decode_num_accepted_tokens_total", ""), 0)
            m["tau"] = 1 + acc / drafts if drafts else None
            rows.append((mode, summ, m))
            print(f"run {i} {mode}: {summ['completed']}/{summ['sent']} complete, p99 TTFT {summ['ttft_ms']['p99']:.0f} "
                  f"ms, p50 {summ['ttft_ms']['p50']:.0f} ms, {summ['output_tokens_per_s']:.1f} tok/s, p99 TPOT "
                  f"{summ['tpot_ms']['p99']:.1f} ms, switches {m['switches']:.0f}", flush=True)

    def med(mode: str, f) -> float:  # noqa: ANN001
        return statistics.median(f(s) for md, s, _ in rows if md == mode)

    lines = [f"Command: `python benchmarks/bench_batching.py --rate {a.rate} --duration {a.duration:g} --max-tokens "
             f"{a.max_tokens} --slots {a.slots} --timeout-ms {a.timeout_ms:g} --block {a.block} --repeats "
             f"{a.repeats} --threads {a.threads}{' --model ' + a.model if a.model else ''} --write` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, this 2-core machine). "
             f"{a.model + ' (bf16)' if a.model else 'Tiny target'}, DSpark markov drafter, block {a.block}, "
             f"{a.slots} slots, batching timeout bound {a.timeout_ms:g} ms; {n} planned requests of {a.max_tokens} "
             f"tokens on one Poisson arrival sequence "
             f"(phases {a.rate} req/s @ s, cycled), client-side figures from loadgen.", "",
             "| run | mode | complete | p99 TTFT ms | p50 TTFT ms | output tok/s | p99 TPOT ms | tau | "
             "block length switches |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k, (mode, s, m) in enumerate(rows):
        tau = f"{m['tau']:.2f}" if m["tau"] else "-"
        lines.append(f"| {k // 2} | {mode} | {s['completed']}/{s['sent']} | {s['ttft_ms']['p99']:.0f} | "
                     f"{s['ttft_ms']['p50']:.0f} | {s['output_tokens_per_s']:.1f} | {s['tpot_ms']['p99']:.1f} | "
                     f"{tau} | {m['switches']:.0f} |")
    ttft_s, ttft_a = med("static", lambda s: s["ttft_ms"]["p99"]), med("adaptive", lambda s: s["ttft_ms"]["p99"])
    thr_s = med("static", lambda s: s["output_tokens_per_s"])
    thr_a = med("adaptive", lambda s: s["output_tokens_per_s"])
    lines += ["", f"Medians: p99 TTFT static {ttft_s:.0f} ms, adaptive {ttft_a:.0f} ms ({ttft_a / ttft_s:.2f}x); "
                  f"throughput static {thr_s:.1f}, adaptive {thr_a:.1f} tok/s ({thr_a / thr_s:.3f}x)."]
    text = "\n".join(lines)
    print(text)
    if a.write:
        write_section("bench_batching" if not a.model else f"bench_batching_{a.model}", text)


if __name__ == "__main__":
    main()
