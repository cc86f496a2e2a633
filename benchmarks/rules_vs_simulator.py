"""Check block-length rules against the simulator: is the simulated optimum inside each rule's range?

For every fixture profile under tests/rules/fixtures the rules are matched into a plan; the plan's fixed
values and preferences (numeric ranges at their preference or midpoint) fill every parameter except
spec.block_size, which is swept over 1..16 (spec.max_verify_tokens follows it). The simulated optimum is
the gamma with the highest throughput among those meeting the workload's TPOT SLO (or the highest
throughput when none does). Every fired rule that gives spec.block_size a range is then checked: it agrees
when its range holds a gamma within --tolerance of the optimum's throughput (simulated curves are jagged:
CUDA-graph buckets, finite request samples). Fixtures whose plan turns speculation off are skipped, and
parallel.tp takes the smallest planned value the simulator finds feasible.

    python benchmarks/rules_vs_simulator.py [--requests 0] [--tolerance 0.03] [--only SUBSTR] [--json out.json]

--requests 0 (the default) simulates what `tune` simulates (6 requests per client, 48..384), so throughput
is read in the closed loop's steady state; a fixed 48 requests is no steady state at 128+ clients.

A benchmark, not a test: it reports, it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kb.errors import PlanConflict  # noqa: E402
from kb.loader import load_rules  # noqa: E402
from kb.match import match_profile  # noqa: E402
from kb.sync import StoredRule  # noqa: E402
from profiler.schema import Profile  # noqa: E402
from tuner.objective import SimulateEvaluator  # noqa: E402
from tuner.space import engine_defaults  # noqa: E402

FIXTURES = ROOT / "tests" / "rules" / "fixtures"
GAMMAS = list(range(1, 17))


def tp_candidates(plan: Any) -> list[int]:
    """Planned tensor-parallel sizes, smallest first."""
    if "parallel.tp" in plan.fixed:
        return [int(plan.fixed["parallel.tp"].value)]
    e = plan.space.get("parallel.tp")
    if e is None:
        return [1]
    if e.kind == "choices":
        return sorted(int(v) for v in e.choices)
    return [v for v in (1, 2, 4, 8, 16) if e.low <= v <= e.high] or [int(e.low)]


def base_params(plan: Any) -> dict[str, Any]:
    """Engine defaults, then the plan's fixed values, preferences and range midpoints."""
    params = dict(engine_defaults())
    for name, entry in plan.space.items():
        if name == "parallel.tp":
            continue
        if name in plan.prefer:
            params[name] = plan.prefer[name].value
        elif entry.kind == "choices":
            params[name] = entry.choices[0]
        else:
            mid = (entry.low + entry.high) / 2
            params[name] = int(round(mid)) if entry.type == "int" else mid
    params.update({k: v.value for k, v in plan.fixed.items()})
    params.setdefault("spec.head", "markov")
    params["spec.enabled"] = True
    return params


def sweep(profile: Profile, params: dict[str, Any], n_requests: int | None,
          tps: list[int]) -> dict[int, dict[str, float]]:
    ev = SimulateEvaluator(profile, n_requests=n_requests or None)
    for tp in tps:  # the smallest planned TP at which one request fits
        params = dict(params, **{"parallel.tp": tp})
        if ev.evaluate(dict(params, **{"spec.block_size": 1, "spec.max_verify_tokens": 1}), seed=0).feasible:
            break
    out: dict[int, dict[str, float]] = {}
    for g in GAMMAS:
        p = dict(params, **{"spec.block_size": g, "spec.max_verify_tokens": g})
        res = ev.evaluate(p, seed=0)
        if res.feasible:
            out[g] = {"throughput": res.metrics["throughput"], "tpot_p99_ms": res.metrics["tpot_p99_ms"]}
    return out


def optimum(points: dict[int, dict[str, float]], slo_tpot: float | None) -> int | None:
    if not points:
        return None
    ok = {g: m for g, m in points.items() if slo_tpot is None or m["tpot_p99_ms"] <= slo_tpot}
    pool = ok or points
    return max(pool, key=lambda g: pool[g]["throughput"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=0,
                    help="simulated requests per point (0: the tuner's default, 6 per client within 48..384)")
    ap.add_argument("--only", default="", help="check only fixtures whose name contains this")
    ap.add_argument("--tolerance", type=float, default=0.03, help="relative throughput gap that still agrees")
    ap.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args()
    rules = [StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules(ROOT / "rules")]
    report: list[dict[str, Any]] = []
    for path in sorted(p for p in FIXTURES.glob("*.json") if args.only in p.stem):
        profile = Profile.model_validate(json.loads(path.read_text()))
        try:
            plan = match_profile(rules, profile)
        except PlanConflict as e:
            print(f"{path.stem}: no plan ({e}); skipped")
            continue
        if "spec.enabled" in plan.fixed and plan.fixed["spec.enabled"].value is False:
            print(f"{path.stem}: speculation is turned off by {', '.join(plan.fixed['spec.enabled'].rules)}; skipped")
            continue
        params = base_params(plan)
        t0 = time.perf_counter()
        try:
            points = sweep(profile, params, args.requests, tp_candidates(plan))
        except Exception as e:  # a fixture the simulator cannot model (e.g. CPU) is reported, not fatal
            print(f"{path.stem}: simulator failed: {type(e).__name__}: {e}")
            continue
        best = optimum(points, profile.workload.slo.tpot_ms if profile.workload.slo else None)
        fired = {f.id for f in plan.fired}
        checks = []
        for sr in rules:
            r = sr.rule
            if r.id not in fired:
                continue
            for a in r.then:
                if a.param == "spec.block_size" and a.range_ is not None and best is not None:
                    lo, hi = a.range_
                    in_range = [points[g]["throughput"] for g in points if lo <= g <= hi]
                    gap = 1.0 - max(in_range) / points[best]["throughput"] if in_range else 1.0
                    checks.append({"rule": r.id, "range": a.range_, "inside": lo <= best <= hi,
                                   "gap": round(gap, 4), "agrees": gap <= args.tolerance})
        row = {"fixture": path.stem, "optimum_gamma": best, "seconds": round(time.perf_counter() - t0, 1),
               "points": points, "checks": checks}
        report.append(row)
        bad = [f"{c['rule']} (gap {c['gap']:.1%})" for c in checks if not c["agrees"]]
        inside = sum(c["inside"] for c in checks)
        print(f"{path.stem}: optimum gamma {best}; {inside}/{len(checks)} ranges contain it, "
              f"{len(checks) - len(bad)}/{len(checks)} agree within {args.tolerance:.0%}"
              f"{'; disagree: ' + ', '.join(bad) if bad else ''} ({row['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
