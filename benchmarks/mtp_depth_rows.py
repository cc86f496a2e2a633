"""Why the TRT-LLM MTP depth sweep ranks as it does: the measured sweep beside the simulator's round, part by part.

TensorRT-LLM tech blog 1 measured DeepSeek-R1 (nvfp4) on 8 x B200 at concurrency 1 with MTP depth 1-5
(benchmarks/spec_published/rows.yaml, `trtllm_blog1_dsr1_b200_mtp*`). A depth wins when its acceptance length
grows faster than its round: speedup = tau / (round / plain step). This prints, per depth:
  - measured: tau, speedup, and the round they imply (tau / speedup, in plain steps);
  - predicted: speedup (`estimate`, as bench_spec_published.py prices the row) and the round's parts
    (tuner.methods.round_cost: verify forward, MTP draft steps, fitted per-round constants);
  - the verify forward's MoE op at K+1 tokens from AIC's measured tables, TRT-LLM's (what prices the row) and
    SGLang's, with its step from the depth before: the term whose unevenness decides the ranking;
  - the token counts AIC's MoE table measured (the rest it interpolates), and the best depth under each MoE
    layout the blog's 8 GPUs could have run (EP 1, 2, 4, 8; the sweep's own is not stated), by tau / round.

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

    def layout_best(ep: int) -> dict[str, Any]:
        from dataclasses import replace

        p = aic_perf(replace(base, ep=ep), profile, "trtllm")[0]
        one = round_cost(p, costs, Drafting(method="none"), 1, 0, CONTEXT).seconds
        gain = {int(r["steps"]): r["measured"]["acceptance_length"] * one /
                round_cost(p, costs, Drafting(method="mtp"), 1, int(r["steps"]), CONTEXT).seconds for r in sweep}
        return {"ep": ep, "best": max(gain, key=gain.__getitem__), "speedup": {k: round(v, 3) for k, v in gain.items()}}

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
            "moe_1_token": {e: round(moe_ms(e, 1), 3) for e in perf},
            "moe_tokens_measured": _measured_tokens(perf["trtllm"].cost_source),
            "layouts": [layout_best(ep) for ep in (1, 2, 4, 8)]}


def _measured_tokens(source: str) -> list[int]:
    """The token counts up to 16 that AIC's MoE table for `source` (aic:SYSTEM/BACKEND/VERSION) timed DeepSeek's
    MoE (7168 hidden, 2048 expert width, 256 experts, top-8) at, in any layout and dtype."""
    import aiconfigurator_core
    import pandas as pd

    system, backend, version = source.split(":", 1)[1].split("/")[:3]
    path = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system / "moe" / backend / version
    d = pd.read_parquet(path / "moe_perf.parquet", columns=["num_tokens", "hidden_size", "inter_size", "num_experts",
                                                           "topk"])
    d = d[(d.hidden_size == 7168) & (d.inter_size == 2048) & (d.num_experts == 256) & (d.topk == 8)]
    return sorted(int(t) for t in d.num_tokens.unique() if t <= 16)


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
    lines += ["", f"Best depth: measured {best_m}, predicted {best_p}.", "",
              "AIC's MoE table times this MoE at " + ", ".join(map(str, res["moe_tokens_measured"])) + " tokens; the "
              "verify forward's other counts are interpolated. Best depth by tau / round under each MoE layout of "
              "the 8 GPUs (the sweep's is not stated): " + "; ".join(
                  f"EP {lay['ep']}: {lay['best']} (" + ", ".join(f"{v:.2f}x" for v in lay["speedup"].values()) + ")"
                  for lay in res["layouts"]) + "."]
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
