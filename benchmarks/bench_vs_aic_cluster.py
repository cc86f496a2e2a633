"""Our cluster planner (tuner/cluster.py) against AIConfigurator's own agg / disagg search, speculation off (issue 39).

    python benchmarks/bench_vs_aic_cluster.py [--write] [--json]
    python benchmarks/bench_vs_aic_cluster.py --refresh-aic [--aic-src DIR]   # rerun AIC's search (minutes)

AIC's search lives in the `aiconfigurator` package (0.12.0, matching aiconfigurator-core 0.12.0); its results are
kept in benchmarks/aic_cluster/aic_results.json with the versions and the call that produced them, since a MoE case
takes a minute of this machine's CPU. `--aic-src`: a folder holding an unpacked `aiconfigurator` package where it
is not installed (`pip download --no-deps aiconfigurator==0.12.0`, then unzip the wheel). AIC's per-row figures are
its tokens/s per GPU of the cluster (idle GPUs counted), as `aiconfigurator cli default` ranks them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AIC_FILE = ROOT / "benchmarks" / "aic_cluster" / "aic_results.json"
ISL, OSL = 4000, 1000
# (AIC system, AIC model id, our GPU, our model, GPUs, TTFT ms, TPOT ms)
CASES = [
    ("h200_sxm", "Qwen/Qwen3-8B", "h200", "Qwen3-8B", 16, 1000, 20),
    ("h200_sxm", "Qwen/Qwen3-8B", "h200", "Qwen3-8B", 16, 300, 10),
    ("h200_sxm", "meta-llama/Meta-Llama-3.1-70B", "h200", "Llama-3.1-70B", 16, 1000, 20),
    ("h200_sxm", "deepseek-ai/DeepSeek-V3", "h200", "DeepSeek-V3", 16, 1000, 20),
    ("h200_sxm", "Qwen/Qwen3-32B", "h200", "Qwen3-32B", 8, 1000, 20),
    ("h200_sxm", "Qwen/Qwen3-30B-A3B", "h200", "Qwen3-30B-A3B", 8, 1000, 20),
    ("h200_sxm", "Qwen/Qwen3-235B-A22B-FP8", "h200", "Qwen3-235B-A22B", 16, 2000, 50),
    ("h200_sxm", "meta-llama/Meta-Llama-3.1-8B", "h200", "Llama-3.1-8B", 8, 2000, 50),
    ("h100_sxm", "Qwen/Qwen3-32B", "h100", "Qwen3-32B", 16, 1000, 20),
    ("h100_sxm", "meta-llama/Meta-Llama-3.1-70B", "h100", "Llama-3.1-70B", 16, 2000, 50),
    ("b200_sxm", "Qwen/Qwen3-32B", "b200", "Qwen3-32B", 8, 1000, 20),
    ("a100_sxm", "meta-llama/Meta-Llama-3.1-8B", "a100", "Llama-3.1-8B", 8, 1000, 20),
]
DTYPE = {"deepseek-ai/DeepSeek-V3": ("fp8", "fp8"), "Qwen/Qwen3-235B-A22B-FP8": ("fp8", "bf16")}  # the checkpoints'


def key(case: tuple) -> str:
    system, model, _, _, gpus, ttft, tpot = case
    return f"{system}|{model}|{gpus}|{ttft}|{tpot}"


def refresh_aic(src: str | None) -> dict[str, Any]:
    """Run AIC's agg and disagg search (Task + pick_default, what `cli default` runs) on every case."""
    import importlib.util
    import logging
    import types

    if src:  # an unpacked wheel: its __init__ reads the installed version, so register the folder as the package
        pkg = types.ModuleType("aiconfigurator")
        pkg.__path__ = [str(Path(src) / "aiconfigurator")]
        pkg.__version__ = "0.12.0"
        sys.modules["aiconfigurator"] = pkg
    if importlib.util.find_spec("plotext") is None:  # imported at module level for terminal plots, unused here
        sys.modules["plotext"] = types.ModuleType("plotext")
    logging.basicConfig(level=logging.ERROR)
    from aiconfigurator.sdk.picking import pick_default
    from aiconfigurator.sdk.task_v2 import Task

    out: dict[str, Any] = {"aiconfigurator": "0.12.0", "isl": ISL, "osl": OSL, "backend": "sglang", "cases": {}}
    for case in CASES:
        system, model, _, _, gpus, ttft, tpot = case
        common = dict(isl=ISL, osl=OSL, ttft=float(ttft), tpot=float(tpot), total_gpus=gpus, database_mode="SILICON")
        tasks = {"agg": Task(serving_mode="agg", model_path=model, system_name=system, backend_name="sglang",
                             **common),
                 "disagg": Task(serving_mode="disagg", prefill_model_path=model, decode_model_path=model,
                                prefill_system_name=system, decode_system_name=system, prefill_backend_name="sglang",
                                decode_backend_name="sglang", **common)}
        rec: dict[str, Any] = {}
        for mode, task in tasks.items():
            t0 = time.perf_counter()
            res = pick_default(task.run(), total_gpus=gpus, serving_mode=mode, target_tpot=float(tpot), top_n=1)
            row = res["best_config_df"].iloc[0]
            cols = ["parallel", "bs", "ttft", "tpot", "tokens/s/user"] if mode == "agg" else \
                ["(p)parallel", "(p)workers", "(d)parallel", "(d)bs", "(d)workers", "num_total_gpus", "ttft",
                 "tpot", "tokens/s/user"]
            rec[mode] = {"tokens_per_s_gpu": round(float(res["best_throughput"]), 2),
                         **{c: (row[c].item() if hasattr(row[c], "item") else row[c]) for c in cols},
                         "seconds": round(time.perf_counter() - t0, 1)}
            rec[mode]["meets_slo"] = bool(rec[mode]["tpot"] <= tpot and rec[mode]["ttft"] <= ttft)
        out["cases"][key(case)] = rec
        print(f"{key(case)}: agg {rec['agg']['tokens_per_s_gpu']}, disagg {rec['disagg']['tokens_per_s_gpu']}",
              file=sys.stderr, flush=True)
    return out


def ours(case: tuple, how: Any = None) -> dict[str, Any]:
    """Our planner's best agg and disagg layouts for the case (`how`: its assumptions, default ours)."""
    from profiler.build import build_profile
    from tuner.cluster import Slo, assumptions_for, plan

    _, model_id, gpu, model, gpus, ttft, tpot = case
    dtype, kv = DTYPE.get(model_id, ("bf16", "bf16"))
    t0 = time.perf_counter()
    prof = build_profile(model, gpu, "chat", measure=False, gpus=gpus)
    got = plan(prof, gpus, ISL, OSL, Slo(ttft, tpot), "auto", dtype=dtype, kv_dtype=kv,
               how=how or assumptions_for(prof))
    out: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 1), "cost": got.cost_source}
    for mode in ("agg", "disagg"):
        best = got.best(mode)
        out[mode] = None if best is None else {"tokens_per_s_gpu": round(best.tokens_per_s_gpu, 2),
                                               "layout": best.describe()}
    return out


def _versus(a: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """Our best layout against AIC's best: the ratio of tokens/s per GPU and whether the serving modes agree."""
    a_best = max(("agg", "disagg"), key=lambda m: a[m]["tokens_per_s_gpu"])
    o_modes = {m: o[m]["tokens_per_s_gpu"] for m in ("agg", "disagg") if o[m]}
    o_best = max(o_modes, key=o_modes.get) if o_modes else None
    ratio = o_modes[o_best] / a[a_best]["tokens_per_s_gpu"] if o_best else None
    return {"ours": o_modes, "our_choice": o_best, "aic_choice": a_best, "ratio": ratio,
            "within_10pct": ratio is not None and abs(ratio - 1) <= 0.10, "agree": a_best == o_best,
            "our_layouts": {m: o[m]["layout"] for m in o_modes}}


def compare() -> dict[str, Any]:
    """Per case: our planner as it plans, and our planner under AIC's own assumptions (tuner/cluster.py
    AIC_SGLANG: the same priced forwards, AIC's derates and worker shapes), each against AIC's search."""
    from tuner.cluster import AIC_SGLANG

    aic = json.loads(AIC_FILE.read_text())["cases"]
    rows = []
    for case in CASES:
        a = aic.get(key(case))
        if a is None:
            rows.append({"case": key(case), "skipped": "no AIC result (run --refresh-aic)"})
            continue
        o, o_aic = ours(case), ours(case, AIC_SGLANG)
        versus = _versus(a, o)
        rows.append({"case": key(case), "aic": {m: a[m]["tokens_per_s_gpu"] for m in ("agg", "disagg")},
                     "aic_layout": _aic_layout(a, versus["aic_choice"]), **versus, "under_aic": _versus(a, o_aic),
                     "seconds": o["seconds"], "cost": o["cost"]})
    done = [r for r in rows if "ratio" in r]
    return {"rows": rows, "within_10pct": sum(r["within_10pct"] for r in done), "agree": sum(r["agree"] for r in done),
            "under_aic_within_10pct": sum(r["under_aic"]["within_10pct"] for r in done),
            "under_aic_agree": sum(r["under_aic"]["agree"] for r in done), "cases": len(done)}


def _aic_layout(a: dict[str, Any], mode: str) -> str:
    """AIC's best layout of `mode` in its own notation (tp / dp = attention DP / etp = MoE TP / ep)."""
    m = a[mode]
    if mode == "agg":
        return f"{m.get('parallel')} x bs {m.get('bs')}"
    return (f"{m.get('(p)workers')}P {m.get('(p)parallel')} + {m.get('(d)workers')}D {m.get('(d)parallel')} "
            f"x bs {m.get('(d)bs')}")


def _markdown(res: dict[str, Any]) -> str:
    lines = ["## Cluster planning against AIConfigurator's own search, speculation off (issue 39)", "",
             f"`python benchmarks/bench_vs_aic_cluster.py --write`; AIC's results: `{AIC_FILE.relative_to(ROOT)}` "
             f"(aiconfigurator 0.12.0 `Task` + `pick_default`, sglang tables, ISL {ISL} / OSL {OSL}); ours: "
             "tuner/cluster.py on the same kernel tables. Tokens/s per GPU of the cluster; the best layouts in AIC's "
             "notation (tp: attention TP, dp: attention DP, etp / ep: MoE TP / EP; bs per attention-DP rank) and "
             "ours (TPn: the worker's GPUs; batch: its requests in all).", "",
             "| case (system, model, GPUs, TTFT/TPOT ms) | AIC agg | AIC disagg | ours agg | ours disagg | ours / AIC "
             "best | mode (AIC / ours) | AIC's best layout | our best layout | under AIC's assumptions: disagg, "
             "ours / AIC best, mode |",
             "|---|---:|---:|---:|---:|---:|---|---|---|---|"]
    for r in res["rows"]:
        if "ratio" not in r:
            lines.append(f"| {r['case']} | {r['skipped']} | | | | | | | | |")
            continue
        s, m, g, t1, t2 = r["case"].split("|")
        o = r["ours"]
        u = r["under_aic"]
        mine = r["our_layouts"][r["our_choice"]].split(" on ")[0]
        lines.append(f"| {s}, {m}, {g}, {t1}/{t2} | {r['aic']['agg']:.0f} | {r['aic']['disagg']:.0f} | "
                     f"{o.get('agg', 0):.0f} | {o.get('disagg', 0):.0f} | {r['ratio']:.2f} | "
                     f"{r['aic_choice']} / {r['our_choice']} | {r['aic_layout']} | "
                     f"{mine} | {u['ours'].get('disagg', 0):.0f}, {u['ratio']:.2f}, {u['our_choice']} |")
    n = res["cases"]
    lines += ["", f"Within 10% of AIC's best: {res['within_10pct']}/{n}; same serving mode: {res['agree']}/{n}. Under "
              f"AIC's assumptions (`tuner/cluster.py` AIC_SGLANG: the same priced forwards with AIC's disagg derates, "
              f"same-attention-TP pairs, one prompt a prefill, no KV transfer, TTFT x 1.8, xPyD groups of 1, 2, 4, 8, "
              f"16, 24, ... GPUs): within 10% {res['under_aic_within_10pct']}/{n}, same mode "
              f"{res['under_aic_agree']}/{n}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refresh-aic", action="store_true", help="rerun AIC's search and rewrite its results file")
    ap.add_argument("--aic-src", help="folder holding an unpacked aiconfigurator package (with --refresh-aic)")
    ap.add_argument("--write", action="store_true", help="write the section into benchmarks/RESULTS.md")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.refresh_aic:
        AIC_FILE.parent.mkdir(parents=True, exist_ok=True)
        data = refresh_aic(a.aic_src)
        tmp = AIC_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(AIC_FILE)
    if not AIC_FILE.exists():
        sys.exit(f"{AIC_FILE.relative_to(ROOT)} is missing: run with --refresh-aic (needs aiconfigurator 0.12.0)")
    res = compare()
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(_markdown(res))
    if a.write:
        from results_md import write_section

        write_section("aic_cluster", _markdown(res))


if __name__ == "__main__":
    main()
