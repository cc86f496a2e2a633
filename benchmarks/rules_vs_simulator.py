"""Check block-length rules against the simulator: is the simulated optimum inside each rule's range?

For every fixture profile under tests/rules/fixtures the rules are matched into a plan; the plan's fixed
values and preferences (numeric ranges at their preference or midpoint) fill every parameter except
spec.block_size, which is swept over 1..16 (spec.max_verify_tokens follows it). The simulated optimum is
the gamma with the highest throughput among those meeting the workload's TPOT SLO (or the highest
throughput when none does). Every fired rule that gives spec.block_size a range is then checked: it agrees
when its range holds a gamma within --tolerance of the optimum's throughput (simulated curves are jagged:
CUDA-graph buckets, finite request samples). Fixtures whose plan turns speculation off are skipped, and
parallel.tp takes the smallest planned value the simulator finds feasible.

    python benchmarks/rules_vs_simulator.py [--requests 0] [--tolerance 0.03] [--only SUBSTR] [--json F] [--write]

Then, at the optimum gamma, the verification length lambda (spec.max_verify_tokens) is swept 1..gamma and every
fired rule giving lambda a range is checked the same way.

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
          tps: list[int]) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """Throughput and p99 TPOT per gamma (lambda = gamma), and the parameters used (TP settled)."""
    ev = SimulateEvaluator(profile, n_requests=n_requests or None)
    for tp in tps:  # the smallest planned TP at which one request fits
        params = dict(params, **{"parallel.tp": tp})
        if ev.evaluate(dict(params, **{"spec.block_size": 1, "spec.max_verify_tokens": 1}), seed=0).feasible:
            break
    return _points(ev, params, [{"spec.block_size": g, "spec.max_verify_tokens": g} for g in GAMMAS],
                   "spec.block_size"), params


def sweep_verify(profile: Profile, params: dict[str, Any], n_requests: int | None,
                 gamma: int) -> dict[int, dict[str, float]]:
    """Throughput and p99 TPOT per verification length lambda = 1..gamma at block length gamma."""
    ev = SimulateEvaluator(profile, n_requests=n_requests or None)
    return _points(ev, params, [{"spec.block_size": gamma, "spec.max_verify_tokens": lam}
                                for lam in range(1, gamma + 1)], "spec.max_verify_tokens")


def _points(ev: Any, params: dict[str, Any], moves: list[dict[str, int]], key: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for move in moves:
        res = ev.evaluate(dict(params, **move), seed=0)
        if res.feasible:
            out[move[key]] = {"throughput": res.metrics["throughput"], "tpot_p99_ms": res.metrics["tpot_p99_ms"]}
    return out


def _check(rule_id: str, rng: list[int], points: dict[int, dict[str, float]], best: int, tolerance: float,
           top: int | None = None) -> dict[str, Any]:
    """Whether `rng` holds a point within `tolerance` of the optimum; a range above `top` (lambda beyond the block)
    means verifying the whole block, the point `top`."""
    lo, hi = rng
    if top is not None:
        lo, hi = min(lo, top), min(hi, top)
    in_range = [points[g]["throughput"] for g in points if lo <= g <= hi]
    gap = 1.0 - max(in_range) / points[best]["throughput"] if in_range else 1.0
    return {"rule": rule_id, "range": rng, "inside": lo <= best <= hi, "gap": round(gap, 4), "agrees": gap <= tolerance}


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
    ap.add_argument("--write", action="store_true", help="record the section rules_vs_simulator of RESULTS.md")
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
        slo = profile.workload.slo.tpot_ms if profile.workload.slo else None
        try:
            points, params = sweep(profile, params, args.requests, tp_candidates(plan))
            best = optimum(points, slo)
            lam_points = sweep_verify(profile, params, args.requests, best) if best else {}
        except Exception as e:  # a fixture the simulator cannot model (e.g. CPU) is reported, not fatal
            print(f"{path.stem}: simulator failed: {type(e).__name__}: {e}")
            continue
        best_lam = optimum(lam_points, slo)
        fired = {f.id for f in plan.fired}
        checks = []
        for sr in rules:
            r = sr.rule
            if r.id not in fired:
                continue
            for a in r.then:
                if a.range_ is None:
                    continue
                if a.param == "spec.block_size" and best is not None:
                    checks.append({"param": "gamma", **_check(r.id, a.range_, points, best, args.tolerance)})
                if a.param == "spec.max_verify_tokens" and best_lam is not None:
                    checks.append({"param": "lambda", **_check(r.id, a.range_, lam_points, best_lam, args.tolerance,
                                                                top=best)})
        row = {"fixture": path.stem, "optimum_gamma": best, "optimum_lambda": best_lam,
               "seconds": round(time.perf_counter() - t0, 1), "points": points, "lambda_points": lam_points,
               "checks": checks}
        report.append(row)
        bad = [f"{c['rule']} (gap {c['gap']:.1%})" for c in checks if not c["agrees"]]
        inside = sum(c["inside"] for c in checks)
        print(f"{path.stem}: optimum gamma {best}, lambda {best_lam} at that gamma; {inside}/{len(checks)} ranges "
              "contain their optimum, "
              f"{len(checks) - len(bad)}/{len(checks)} agree within {args.tolerance:.0%}"
              f"{'; disagree: ' + ', '.join(bad) if bad else ''} ({row['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.write:
        from benchmarks.results_md import write_section

        write_section("rules_vs_simulator", _markdown(report, args.tolerance))
    return 0


def _markdown(report: list[dict[str, Any]], tolerance: float) -> str:
    checks = [(r["fixture"], c) for r in report for c in r["checks"]]
    by = {p: [c for _, c in checks if c["param"] == p] for p in ("gamma", "lambda")}
    lines = ["## Block-length and verify-length rules vs the simulator (issues 7, 17)", "",
             f"Command: `python benchmarks/rules_vs_simulator.py --write` ({time.strftime('%Y-%m-%d %H:%M UTC')}, "
             "this 2-core machine). Per rule fixture: gamma swept 1..16 (lambda = gamma), then lambda swept 1..gamma* "
             f"at the optimum gamma*; a fired rule's range agrees when it holds a point within {tolerance:.0%} of "
             "the optimum (a lambda range above gamma* means verifying the whole block).", ""]
    for p, cs in by.items():
        agree = sum(c["agrees"] for c in cs)
        lines.append(f"- {p}: {agree}/{len(cs)} rule ranges agree, {sum(c['inside'] for c in cs)} hold the optimum")
    lines += ["", "| fixture | gamma* | lambda* | disagreeing rules (gap) |", "|---|---:|---:|---|"]
    for r in report:
        bad = ", ".join(f"{c['rule']} ({c['gap']:.1%})" for c in r["checks"] if not c["agrees"]) or "none"
        lines.append(f"| {r['fixture']} | {r['optimum_gamma']} | {r['optimum_lambda']} | {bad} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
