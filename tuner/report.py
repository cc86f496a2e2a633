"""report.md and its PNG plots: what shaped the space, what was tuned, the figures, provenance."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kb.match import Plan
from profiler.schema import Profile
from tuner import plots
from tuner.acceptance import acceptance_for
from tuner.objective import OBJECTIVES, Evaluator
from tuner.space import SearchSpace
from tuner.study import StudySpec, completed, feasible_trials


def _how(name: str, space: SearchSpace, plan: Plan) -> str:
    if name in plan.fixed:
        return f"fixed by {', '.join(plan.fixed[name].rules)}"
    if name in space.distributions:
        e = plan.space.get(name)
        if e is None:
            return "tuned"
        where = f"{e.choices}" if e.kind == "choices" else f"[{e.low}, {e.high}]"
        return f"tuned over {where} (rules {', '.join(e.rules)})"
    if name in plan.prefer:
        return f"preferred by {', '.join(plan.prefer[name].rules)}"
    return "engine default"


def _pareto(trials: list[Any], spec: StudySpec) -> list[Any]:
    signs = [1 if OBJECTIVES[o][1] == "maximize" else -1 for o in spec.objectives]
    keyed = [(t, [s * v for s, v in zip(signs, t.values, strict=True)]) for t in trials]
    front = [t for t, a in keyed if not any(all(x >= y for x, y in zip(b, a, strict=True)) and b != a
                                             for _, b in keyed)]
    return sorted(front, key=lambda t: -signs[0] * t.values[0])


def write_report(out: Path, template, study, spec: StudySpec, trial, meets: bool, params: dict[str, Any],
                 space: SearchSpace, plan: Plan, profile: Profile, evaluator: Evaluator, sps, db_url: str,
                 common: dict[str, Any]) -> None:
    trials = completed(study)
    feasible_ids = {t.number for t in feasible_trials(study)}
    front = _pareto(trials, spec)
    made: list[dict[str, str]] = []
    plots.history(trials, spec.objectives[0], out / "history.png")
    made.append({"title": "Optimisation history", "file": "history.png"})
    if len(spec.objectives) >= 2 and trials:
        plots.pareto(trials, {t.number for t in front}, spec.objectives, out / "pareto.png")
        made.append({"title": "Pareto front", "file": "pareto.png"})
    if len(space.distributions) >= 2 and len(trials) >= 4:
        import warnings

        import optuna

        sign = -1.0 if OBJECTIVES[spec.objectives[0]][1] == "maximize" else 1.0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(study, target=lambda t: sign * t.values[0])
        except (RuntimeError, ValueError, ZeroDivisionError):
            imp = {}
        if imp:
            plots.importances(dict(imp), out / "importances.png")
            made.append({"title": "Parameter importances", "file": "importances.png"})
    kind = "modelled by the performance model" if evaluator.mode == "simulate" else "measured on this device"
    plots.sps_curve(list(sps.sample_batch_tokens), list(sps.sample_steps_per_sec), kind, out / "sps.png")
    made.append({"title": "SPS table", "file": "sps.png"})
    gamma = int(params["spec.block_size"])
    curves = {head: acceptance_for(profile, head).alphas(gamma) for head in ("none", "markov", "rnn")}
    source = acceptance_for(profile, params["spec.head"]).source
    plots.acceptance(curves, source, out / "acceptance.png")
    made.append({"title": "Acceptance by position", "file": "acceptance.png"})

    slo = [f"p99 TPOT <= {spec.slo_tpot_ms} ms" if spec.slo_tpot_ms else "",
           f"p99 TTFT <= {spec.slo_ttft_ms} ms" if spec.slo_ttft_ms else ""]
    text = template.render(
        **common, mode_line=f"{'SIMULATED' if evaluator.mode == 'simulate' else 'MEASURED'}: {evaluator.describe()}",
        n_complete=len(trials), n_feasible=len(feasible_ids), objectives=spec.objectives,
        slo_line=", ".join(s for s in slo if s) or "none given",
        best={"number": trial.number, "metrics": trial.user_attrs.get("metrics", {})} if meets else None,
        fallback_number=trial.number, fallback_misses=_misses(trial.user_attrs.get("metrics", {}), spec),
        params=[{"name": k, "value": v, "how": _how(k, space, plan)} for k, v in sorted(params.items())],
        fired=[f.model_dump() for f in plan.fired], resolutions=plan.resolutions,
        advice=[a.model_dump() for a in plan.advice],
        pareto=[{"number": t.number, "vals": t.values, "feasible": t.number in feasible_ids} for t in front[:15]],
        plots=made, sps_kind=kind, sps_rows=list(zip(sps.sample_batch_tokens, sps.sample_steps_per_sec, strict=True)),
        acceptance_line=f"Acceptance model: {source}.", profile_hash=profile.content_hash(),
        profile_id=spec.profile_id, plan_id=spec.plan_id, db_url=_redact(db_url), tool_version=spec.tool_version,
        exported_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    (out / "report.md").write_text(text)


def _redact(url: str) -> str:
    from kb.db import _redact as redact

    return redact(url)


def _misses(metrics: dict[str, float], spec: Any) -> str:
    """How far a trial is from each SLO it misses, e.g. "p99 TPOT 2.1 ms against 0.5 ms (4.2x)"."""
    out = []
    for label, key, limit in (("TPOT", "tpot_p99_ms", spec.slo_tpot_ms), ("TTFT", "ttft_p99_ms", spec.slo_ttft_ms)):
        got = metrics.get(key)
        if limit and got is not None and got > limit:
            out.append(f"p99 {label} {got:.4g} ms against {limit:g} ms ({got / limit:.2g}x)")
    return "; ".join(out) or "it did not run (infeasible: memory or an unsupported setting)"
