"""Every plan over the catalogues: models x GPUs x device counts, checked point by point against what can run.

For each catalogue model, catalogue GPU (the CPU row aside: `tune --gpu cpu` measures instead) and device count
in {unstated, 1, 2, 8, 16} the profile is built (chat workload) and matched into a plan. Every point of the plan's
(TP x weight dtype x KV dtype x EP x DP attention) space is then checked with the evaluator's own view of what
runs, written here without kb/feasible.py:
- the simulator's memory test (tuner/simulate.py): KV tokens left after the weights at the plan's lowest
  memory.fraction_static (tuner/perf.py PerfModel.kv_capacity_tokens, the profile's weight bytes) must hold
  the longest of the requests the simulator draws for the workload (two seeds);
- the objective's refusals (tuner/objective.py): TP over the device count, FP8 KV without FP8 cores, 4-bit weights
  under the standard quality floor;
- divisibility: the query heads over TP, the KV heads over TP or TP over them (replication), EP dividing TP and the
  experts.
A plan that raises instead (no layout runs) is checked by brute force over TP {1..64} x every dtype the quality
floor and the GPU allow, at the highest static fraction the rules allow: if one of those holds the workload's p99.9
request (and the simulator's longest draw), the plan missed a feasible deployment.

    python benchmarks/plan_matrix.py [--write] [--json out.json] [--only SUBSTR]

A benchmark, not a test: it reports (and `--write` records the section `plan_matrix` of RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kb.errors import PlanConflict  # noqa: E402
from kb.loader import load_rules  # noqa: E402
from kb.match import Plan, match_profile  # noqa: E402
from kb.sync import StoredRule  # noqa: E402
from profiler.build import build_profile  # noqa: E402
from profiler.catalog import gpus, models  # noqa: E402
from profiler.schema import Profile  # noqa: E402

COUNTS = (None, 1, 2, 8, 16)
ALL_TP = (1, 2, 4, 8, 16, 32, 64)
DTYPES = ("auto", "bf16", "fp16", "fp8", "int8", "int4", "nvfp4")


def plan_values(plan: Plan, param: str, default: Any) -> list[Any]:
    if param in plan.fixed:
        return [plan.fixed[param].value]
    e = plan.space.get(param)
    if e is None:
        return [default]
    if e.kind == "choices":
        return [v for v in e.choices or [] if v not in e.exclude]
    return [v for v in ALL_TP if e.low <= v <= e.high and v not in e.exclude]  # an integer TP range (a defect)


def lowest_fraction(plan: Plan) -> float:
    if "memory.fraction_static" in plan.fixed:
        return float(plan.fixed["memory.fraction_static"].value)
    e = plan.space.get("memory.fraction_static")
    return float(e.low) if e is not None and e.low is not None else 0.85


def longest_request(profile: Profile) -> int:
    """The longest request (prompt + output) the simulator draws for this workload, over two seeds."""
    from tuner.simulate import make_requests

    n = min(384, max(48, 6 * (profile.workload.concurrency or 16)))
    draws = (make_requests(profile, n, np.random.default_rng(seed))[0] for seed in (0, 1))
    return max(r.prompt + r.output for reqs in draws for r in reqs)


def why_not(profile: Profile, tp: int, dtype: str, kv: str, ep: int, frac: float, longest: int,
            dp_attention: bool = False) -> str | None:
    """Why the point cannot run (None: it runs), by the evaluator's and the engines' own tests."""
    from tuner.objective import moe_layout
    from tuner.perf import Efficiency, Hardware, ModelShape, PerfModel

    m, hw = profile.model, profile.hw
    count = hw.count or 8
    if tp > count:
        return f"tp {tp} > {count} devices"
    if m.num_heads and m.num_heads % tp:
        return f"{m.num_heads} heads do not divide over tp {tp}"
    if m.num_kv_heads and m.attention != "mla" and m.num_kv_heads % tp and tp % m.num_kv_heads:
        return f"{m.num_kv_heads} KV heads neither divide nor replicate over tp {tp}"
    if ep > 1 and (tp % ep or (m.num_experts and m.num_experts % ep)):
        return f"ep {ep} does not divide tp {tp} / {m.num_experts} experts"
    if kv.startswith("fp8") and hw.fp8 is False:
        return "fp8 KV without FP8 cores"
    if dtype in ("int4", "nvfp4") and profile.workload.quality != "relaxed":
        return "4-bit weights under the standard quality floor"
    if dtype == "nvfp4" and hw.arch != "blackwell":
        return "nvfp4 off Blackwell"
    kvd = "bf16" if kv in ("auto", None) else kv
    wd = ("fp32" if hw.arch == "cpu" else "bf16") if dtype == "auto" else dtype
    dp, ep = moe_layout({"parallel.dp_attention": dp_attention, "parallel.ep": ep}, tp, bool(m.num_experts))
    perf = PerfModel(ModelShape.from_profile(profile), Hardware.from_profile(profile), Efficiency.default(),
                     weights_dtype=wd, kv_dtype=kvd, tp=tp, attn_dp=dp, ep=ep)
    cap = perf.kv_capacity_tokens(frac) / dp  # a request's KV lives on its one attention-DP rank
    if cap < longest:
        return f"{cap:,.0f} KV tokens left < the {longest:,}-token longest request"
    return None


def check(profile: Profile, plan: Plan) -> list[str]:
    """Every plan point that cannot run, as 'tp=.. dtype=..: why'."""
    frac, longest = lowest_fraction(plan), longest_request(profile)
    bad = []
    eps = plan_values(plan, "parallel.ep", 1)
    dps = plan_values(plan, "parallel.dp_attention", False)
    for tp in plan_values(plan, "parallel.tp", 1):
        for dtype in plan_values(plan, "weights.dtype", "auto"):
            for kv in plan_values(plan, "kv.dtype", "auto"):
                for ep in eps:
                    for dp in dps:
                        why = why_not(profile, int(tp), str(dtype), str(kv), int(ep), frac, longest, bool(dp))
                        if why:
                            bad.append(f"tp={tp} dtype={dtype} kv={kv} ep={ep} dp_attention={dp}: {why}")
    return bad


def brute_force(profile: Profile, stored: list[StoredRule]) -> str | None:
    """A deployment that runs when the plan found none (any TP and dtype, bf16 KV, at the highest static fraction
    the rules allow, holding the workload's p99.9 request), else None."""
    from kb.feasible import fraction_range
    from kb.feasible import longest_request as p999

    longest = max(longest_request(profile), int(p999(profile)))
    top = fraction_range(match_profile(stored, profile, feasible=False))[1]
    for tp in ALL_TP:
        for dtype in DTYPES:
            if why_not(profile, tp, dtype, "auto", 1, top, longest) is None:
                return f"tp={tp} dtype={dtype}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="record the section plan_matrix of RESULTS.md")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--only", default="", help="only models or GPUs whose name contains this")
    args = ap.parse_args()
    stored = [StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules(ROOT / "rules")]
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    cases = [(m.name, g.name, c) for m in models() for g in gpus() if g.arch != "cpu" for c in COUNTS
             if not args.only or args.only.lower() in f"{m.name} {g.name}".lower()]
    for i, (model, gpu, count) in enumerate(cases):
        profile = build_profile(model, gpu, "chat", measure=False, gpus=count)
        row: dict[str, Any] = {"model": model, "gpu": gpu, "count": count}
        try:
            plan = match_profile(stored, profile)
        except PlanConflict as e:
            row.update(status="no layout", why=str(e), missed=brute_force(profile, stored))
        else:
            bad = check(profile, plan)
            row.update(status="plan", points=len(plan_values(plan, "parallel.tp", 1)) *
                       len(plan_values(plan, "weights.dtype", "auto")), bad=bad[:3], n_bad=len(bad),
                       tp=plan_values(plan, "parallel.tp", 1), dtype=plan_values(plan, "weights.dtype", "auto"))
        rows.append(row)
        if (i + 1) % 100 == 0:
            print(f"{i + 1}/{len(cases)} profiles ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    elapsed = time.time() - t0
    status = Counter(r["status"] for r in rows)
    bad_plans = [r for r in rows if r.get("n_bad")]
    missed = [r for r in rows if r.get("missed")]
    summary = {"profiles": len(rows), "plans": status["plan"], "no_layout": status["no layout"],
               "plans_with_unrunnable_points": len(bad_plans), "missed_feasible": len(missed),
               "seconds": round(elapsed, 1)}
    print(json.dumps(summary))
    for r in bad_plans[:10]:
        print("UNRUNNABLE", r["model"], r["gpu"], r["count"], r["bad"])
    for r in missed[:10]:
        print("MISSED", r["model"], r["gpu"], r["count"], r["missed"], "|", r["why"])
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if args.write:
        from benchmarks.results_md import write_section

        write_section("plan_matrix", _markdown(summary, rows))
    return 1 if bad_plans or missed else 0


def _markdown(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    nm, ng = len({r["model"] for r in rows}), len({r["gpu"] for r in rows})
    by_count = Counter((str(r["count"]), r["status"]) for r in rows)
    lines = ["## Plan matrix: every catalogue model x GPU x device count (issue 17)", "",
             "Command: `python benchmarks/plan_matrix.py --write` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, this 2-core machine, "
             f"{summary['seconds']:.0f} s). {nm} models x {ng} GPUs x device counts "
             "{unstated, 1, 2, 8, 16}, chat workload. Each plan's every (TP x weight dtype x KV dtype x EP x DP "
             "attention) point is "
             "checked by the simulator's memory test (KV left after the weights at the plan's lowest static fraction "
             "must hold the longest request it draws), the objective's refusals and head / expert divisibility; a "
             "plan that raises is checked by brute force over TP 1..64 x every dtype.", "",
             f"- profiles: {summary['profiles']}; plans: {summary['plans']}; no layout runs (one-line error): "
             f"{summary['no_layout']}",
             f"- plans with a point that cannot run: **{summary['plans_with_unrunnable_points']}**",
             f"- profiles where a feasible deployment exists but the plan raised: **{summary['missed_feasible']}**",
             "", "| devices | plans | no layout |", "|---|---:|---:|"]
    for c in ("None", "1", "2", "8", "16"):
        lines.append(f"| {'unstated' if c == 'None' else c} | {by_count[(c, 'plan')]} | {by_count[(c, 'no layout')]} |")
    for r in (r for r in rows if r.get("missed")):
        lines.append(f"- missed: {r['model']} / {r['gpu']} x {r['count']} raised, yet {r['missed']} runs")
    examples = [r for r in rows if r["status"] == "no layout"][:3]
    if examples:
        lines += ["", "Examples of the one-line error:"] + [f"- {r['model']} / {r['gpu']} x {r['count']}: {r['why']}"
                                                            for r in examples]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
