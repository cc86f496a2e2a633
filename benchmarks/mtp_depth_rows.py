"""Why the TRT-LLM MTP depth sweep ranks as it does: the measured sweep beside the simulator's round, part by part.

TensorRT-LLM tech blog 1 measured DeepSeek-R1 (nvfp4) on 8 x B200 at concurrency 1 with MTP depth 1-5
(benchmarks/spec_published/rows.yaml, `trtllm_blog1_dsr1_b200_mtp*`). A depth wins when its acceptance length
grows faster than its round: speedup = tau / (round / plain step). This prints, per depth:
  - measured: tau, speedup, and the round they imply (tau / speedup, in plain steps);
  - predicted: speedup (`estimate`, as bench_spec_published.py prices the row) and the round's parts
    (tuner.methods.round_cost: verify forward, MTP draft steps, fitted per-round constants);
  - the verify forward's MoE op at K+1 tokens from AIC's measured tables, TRT-LLM's (what prices the row) and
    SGLang's, with its step from the depth before: the term whose unevenness decides the ranking.

    python benchmarks/mtp_depth_rows.py [--json] [--write]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_md import shown_command, write_section  # noqa: E402

PREFIX = "trtllm_blog1_dsr1_b200_mtp"
CONTEXT = 1024 + 1024  # ISL 1k, mid-way through OSL 2k


def run() -> dict[str, Any]:
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    from benchmarks import bench_spec_published as bench
    from profiler.build import build_profile
    from tuner.aic import aic_perf
    from tuner.methods import Drafting, engine_costs, round_cost
    from tuner.perf import Efficiency, Hardware, ModelShape, PerfModel

    rows = yaml.safe_load(bench.ROWS.read_text())
    sweep = sorted((r for r in rows if r["id"].startswith(PREFIX) and r["id"][len(PREFIX):].isdigit()
                    and int(r["id"][len(PREFIX):]) > 0), key=lambda r: r["steps"])
    preds = {p["id"]: p for p in bench.predict(sweep, rows)}
    profile = build_profile("DeepSeek-R1", "b200", "chat", measure=False)
    base = PerfModel(ModelShape.from_profile(profile), Hardware.from_profile(profile), Efficiency.prior(profile.hw),
                     weights_dtype="nvfp4", tp=8)
    perf = {e: aic_perf(base, profile, e)[0] for e in ("trtllm", "sglang")}
    costs = engine_costs("trtllm", profile.hw.arch)
    plain = round_cost(perf["trtllm"], costs, Drafting(method="none"), 1, 0, CONTEXT).seconds

    def moe_ms(engine: str, tokens: int) -> float:
        ops = perf[engine].aic.decode_ops(tokens, 1, CONTEXT)
        return sum(ms for name, ms in ops if "moe" in name)

    out = []
    for r in sweep:
        k, m = int(r["steps"]), r["measured"]
        rc = round_cost(perf["trtllm"], costs, Drafting(method="mtp"), 1, k, CONTEXT)
        out.append({"steps": k, "tau": m["acceptance_length"], "measured": m["speedup"],
                    "measured_round": round(m["acceptance_length"] / m["speedup"], 4),
                    "predicted": round(preds[r["id"]]["predicted"], 3),
                    "verify_ms": round(rc.verify_s * 1e3, 3), "draft_ms": round(rc.draft_s * 1e3, 3),
                    "fixed_ms": round(rc.fixed_s * 1e3, 3), "round": round(rc.seconds / plain, 4),
                    "moe_trtllm_ms": round(moe_ms("trtllm", k + 1), 3),
                    "moe_sglang_ms": round(moe_ms("sglang", k + 1), 3)})
    return {"plain_ms": round(plain * 1e3, 3), "cost": perf["trtllm"].cost_source, "depths": out,
            "moe_1_token": {e: round(moe_ms(e, 1), 3) for e in perf}}


def markdown(res: dict[str, Any]) -> str:
    lines = ["## TRT-LLM MTP depth sweep: what decides the best depth (issue 37)", "",
             f"`{shown_command('benchmarks/mtp_depth_rows.py')}`. DeepSeek-R1 nvfp4, 8 x B200, concurrency 1, priced "
             f"by {res['cost']}; plain step {res['plain_ms']} ms. Round = one speculative round in plain steps "
             "(measured: tau / speedup). MoE = the verify forward's MoE op at K+1 tokens (AIC's measured tables; "
             f"1 token: TRT-LLM {res['moe_1_token']['trtllm']} ms, SGLang {res['moe_1_token']['sglang']} ms), "
             "its step from the depth before in brackets.", "",
             "| K | tau | measured | predicted | round: measured | round: predicted | verify ms | draft ms | "
             "fixed ms | MoE TRT-LLM ms | MoE SGLang ms |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    prev: dict[str, Any] | None = None
    for d in res["depths"]:
        def step(key: str, d: dict = d, prev: dict | None = prev) -> str:
            return f"{d[key]:.3f}" + (f" (+{d[key] - prev[key]:.3f})" if prev else "")
        lines.append(f"| {d['steps']} | {d['tau']:.2f} | {d['measured']:.2f}x | {d['predicted']:.2f}x | "
                     f"{d['measured_round']:.3f} | {d['round']:.3f} | {d['verify_ms']:.3f} | {d['draft_ms']:.3f} | "
                     f"{d['fixed_ms']:.3f} | {step('moe_trtllm_ms')} | {step('moe_sglang_ms')} |")
        prev = d
    best_m = max(res["depths"], key=lambda d: d["measured"])["steps"]
    best_p = max(res["depths"], key=lambda d: d["predicted"])["steps"]
    lines += ["", f"Best depth: measured {best_m}, predicted {best_p}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the section into benchmarks/RESULTS.md")
    a = ap.parse_args()
    res = run()
    print(json.dumps(res, indent=1) if a.json else markdown(res))
    if a.write:
        write_section("mtp_depth_rows", markdown(res))


if __name__ == "__main__":
    main()
