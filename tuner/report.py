"""report.md and its PNG plots: what shaped the space, what was tuned, the figures, provenance."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kb.match import Plan
from kb.params import param_spec
from profiler.schema import Profile
from tuner import plots
from tuner.acceptance import acceptance_for, acceptance_of
from tuner.objective import METRIC_UNITS, OBJECTIVES, Evaluator
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
        searched = list(getattr(space.distributions[name], "choices", None) or [])
        if e.kind == "choices" and searched and searched != list(e.choices):  # the study widened or narrowed it
            return f"tuned over {searched} (the plan's {where}, rules {', '.join(e.rules)}; the study's own space)"
        return f"tuned over {where} (rules {', '.join(e.rules)})"
    if name in plan.prefer:
        return f"preferred by {', '.join(plan.prefer[name].rules)}"
    spec = param_spec(name)
    if spec is not None and spec.design:
        return "drafter design default (modelled, not exported)"
    return "engine default"


def _pareto(trials: list[Any], spec: StudySpec) -> list[Any]:
    signs = [1 if OBJECTIVES[o][1] == "maximize" else -1 for o in spec.objectives]
    keyed = [(t, [s * v for s, v in zip(signs, t.values, strict=True)]) for t in trials]
    front = [t for t, a in keyed if not any(all(x >= y for x, y in zip(b, a, strict=True)) and b != a
                                             for _, b in keyed)]
    return sorted(front, key=lambda t: -signs[0] * t.values[0])


def write_report(out: Path, template, study, spec: StudySpec, trial, meets: bool, params: dict[str, Any],
                 space: SearchSpace, plan: Plan, profile: Profile, evaluator: Evaluator, sps, db_url: str,
                 common: dict[str, Any], schedules: dict[str, Any] | None = None) -> None:
    """report.md and its plots; `schedules`: the exported draft length per batch size, per engine."""
    trials = completed(study)
    feasible_ids = {t.number for t in feasible_trials(study)}
    front = _pareto([t for t in trials if t.number in feasible_ids] or trials, spec)  # of what meets the SLOs
    made: list[dict[str, str]] = []
    labels = [OBJECTIVES[o][2] for o in spec.objectives]
    plots.history(trials, labels[0], out / "history.png", feasible_ids, trial.number,
                  OBJECTIVES[spec.objectives[0]][1] == "maximize")
    made.append({"title": "Optimisation history", "file": "history.png"})
    if len(spec.objectives) >= 2 and trials:
        plots.pareto(trials, {t.number for t in front}, labels, out / "pareto.png", feasible_ids, trial.number)
        made.append({"title": "Pareto front", "file": "pareto.png"})
    varied = varied_params(trials)
    if len(varied) >= 2 and len(trials) >= 4:
        import warnings

        import optuna

        sign = -1.0 if OBJECTIVES[spec.objectives[0]][1] == "maximize" else 1.0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(study, params=varied,
                                                              target=lambda t: sign * t.values[0])
        except (RuntimeError, ValueError, ZeroDivisionError):
            imp = {}
        if imp:
            plots.importances(dict(imp), out / "importances.png")
            made.append({"title": "Parameter importances", "file": "importances.png"})
    kind = (f"modelled, cost source {evaluator.perf(params).cost_source}" if evaluator.mode == "simulate"
            else "measured on this device")
    plots.sps_curve(list(sps.sample_batch_tokens), list(sps.sample_steps_per_sec), kind, out / "sps.png")
    made.append({"title": "SPS table", "file": "sps.png"})
    from tuner.gains import report_section

    bought = report_section(evaluator, params, space, spec.seed, schedules or {}, out / "speedup.png")
    if bought is not None:
        made.append({"title": "Predicted speedup against concurrency, per method", "file": "speedup.png"})
    source = "none (speculation is off)"
    if params.get("spec.enabled", True):
        source = _acceptance_plot(out, trial, params, profile, evaluator)
        made.append({"title": "Acceptance by position", "file": "acceptance.png"})

    slo = [f"p99 TPOT <= {spec.slo_tpot_ms} ms" if spec.slo_tpot_ms else "",
           f"p99 TTFT <= {spec.slo_ttft_ms} ms" if spec.slo_ttft_ms else ""]
    cut = [t.number for t in trials if t.user_attrs.get("metrics", {}).get("cut_requests")]
    mode_line = f"{'SIMULATED' if evaluator.mode == 'simulate' else 'MEASURED'}: {evaluator.describe()}"
    if evaluator.mode == "simulate":
        mode_line += ". " + cost_line(trials, trial)
    if cut:
        mode_line += (f"; {len(cut)} trial(s) hit the {spec.trial_seconds:g} s limit and are scored on what they "
                      f"generated by then (trials {', '.join(map(str, cut[:10]))})")
    from tuner.live.confirm import CONFIRM_ATTR, exported_metrics
    from tuner.live.isolate import ISOLATION_ATTR
    from tuner.live.report import calibration_line, live_rows, parallel_line

    assumed = assumed_line(profile, params, evaluator, exported_metrics(study, spec, trial), spec.seed)
    text = template.render(
        **common, mode_line=mode_line, assumed_line=assumed, layout_line=layout_line(profile, params),
        running_line=running_line(profile, params, evaluator.mode),
        live_rows=live_rows(trials, study.user_attrs.get(CONFIRM_ATTR)),
        calibration_line=calibration_line(trials),
        parallel_line=parallel_line(trials, study.user_attrs.get(ISOLATION_ATTR)),
        n_complete=len(trials), n_feasible=len(feasible_ids), objectives=labels,
        units=METRIC_UNITS,
        slo_line=", ".join(s for s in slo if s) or "none given",
        best={"number": trial.number, "metrics": exported_metrics(study, spec, trial)} if meets else None,
        fallback_number=trial.number, fallback_misses=_misses(trial.user_attrs.get("metrics", {}), spec),
        params=[{"name": k, "value": v, "how": _how(k, space, plan)} for k, v in sorted(params.items())],
        fired=[f.model_dump() for f in plan.fired], resolutions=plan.resolutions,
        advice=[a.model_dump() for a in plan.advice],
        pareto=[{"number": t.number, "vals": t.values, "feasible": t.number in feasible_ids} for t in front[:15]],
        plots=made, sps_kind=kind, sps_rows=list(zip(sps.sample_batch_tokens, sps.sample_steps_per_sec, strict=True)),
        acceptance_line=f"Acceptance model: {source}.", drafter_line=drafter_line(profile, params),
        bought=bought, method_line=method_line(profile, params, schedules or {}, searched_methods(
            trials, trial, OBJECTIVES[spec.objectives[0]][1] == "maximize")),
        profile_hash=profile.content_hash(),
        profile_id=spec.profile_id, plan_id=spec.plan_id, db_url=_redact(db_url), tool_version=spec.tool_version,
        exported_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    (out / "report.md").write_text(text)


def searched_methods(trials: list[Any], exported: Any, maximize: bool = True) -> dict[str, float]:
    """Where the study searched `spec.method`: each searched method's best first objective (the largest, or the
    smallest where it is minimised) over the completed trials (in the order searched; NaN for one no trial ran),
    else {}. A trial with speculation off is plain decoding whatever its `spec.method` says (the parameter is
    inert there), so it counts as `plain`, never as the method it names."""
    dist = exported.distributions.get("spec.method")
    choices = [str(c) for c in getattr(dist, "choices", ())]
    if len(choices) < 2:
        return {}
    best: dict[str, float] = {c: float("nan") for c in choices}
    for t in trials:
        m = str(t.params.get("spec.method", "")) if t.params.get("spec.enabled", True) else "plain"
        if m == "plain":
            best.setdefault("plain", float("nan"))
        if m in best and t.values:
            v, old = float(t.values[0]), best[m]
            if old != old or (v > old if maximize else v < old):  # NaN: the first trial of the method sets it
                best[m] = v
    return best


def method_line(profile: Profile, params: dict[str, Any], schedules: dict[str, Any],
                searched: dict[str, float] | None = None) -> str:
    """Which speculative method the bundle deploys, among which the study chose (`searched`: the methods it
    searched, each with its best first objective), and its draft-length schedule."""
    runs = ", ".join(f"{m} {v:.4g}" if v == v else f"{m} (no trial)" for m, v in (searched or {}).items())
    if not params.get("spec.enabled", True):
        return "Speculation is off in the exported configuration" + (
            f": plain decoding, chosen among the methods the study searched (best trial of each: {runs})."
            if runs else ".")
    from kb.method_choice import runnable_methods

    method = str(params.get("spec.method") or "dspark")
    if runs:
        line = f"Method: **{method}**, chosen among the methods the study searched (best trial of each: {runs})"
    else:
        among = runnable_methods(profile)
        line = f"Method: **{method}**" + (f", chosen among {', '.join(among)} (what this deployment has drafters "
                                          "for)" if among and len(among) > 1 else "")
    parts = []
    for engine, sched in schedules.items():
        if sched:
            ranges = ", ".join(f"{lo}-{hi}: {k}" for lo, hi, k in sched)
            parts.append(f"{engine} (batch size: draft tokens) {ranges}")
    if parts:
        line += (". Draft length per running batch size, the tuned one at and below the simulated load: "
                 + "; ".join(parts))
    return line + "."


def drafter_line(profile: Profile, params: dict[str, Any]) -> str:
    """Which drafter checkpoint the bundle deploys, or (none exists) which one to train: the drafter design the
    simulator modelled, as advice; a checkpoint's head, depth and rank are never exported as flags."""
    if not params.get("spec.enabled", True):
        return "Speculation is off in the exported configuration: no drafter is deployed."
    d = profile.drafter
    method = str(params.get("spec.method") or "dspark")
    if method != "dspark":
        from tuner.spec_targets import CHECKPOINT_METHODS, drafter_checkpoint

        ck = drafter_checkpoint(profile, method, None)
        if method in CHECKPOINT_METHODS:
            return f"Deployed {method} drafter: `{ck}`." if ck else \
                f"No published {method} drafter for {profile.model.name}: set DRAFT_MODEL_PATH to one."
        return {"mtp": "Deployed drafter: the MTP module inside the target checkpoint.",
                "ngram": "No drafter: n-gram proposals are looked up in the prompt and output on the host.",
                "suffix": "No drafter: suffix-tree proposals are looked up on the host (vLLM's Arctic Inference; "
                          "SGLang 0.5.23 has no suffix decoding, so sglang.sh refuses to start)."}.get(method, "")
    if d.id:
        return (f"Deployed drafter: `{d.id}` ({', '.join(d.heads or [])} head, {d.layers} draft layers, Markov rank "
                f"{d.markov_rank}, trained for {d.block_size}-token blocks), whose head, depth and rank come from the "
                "checkpoint.")
    head, layers = params.get("spec.head"), params.get("spec.draft_layers")
    rank, gamma = params.get("spec.markov_rank"), params.get("spec.block_size")
    return (f"No DSpark drafter checkpoint exists for {profile.model.name or 'this model'}: the simulation modelled a "
            f"drafter with the {head} head, {layers} draft layers and Markov rank {rank} for {gamma}-token blocks. "
            f"Train it (`python cli.py train-drafter --target MODEL_FOLDER --head {head} --layers {layers} --rank "
            f"{rank} --block-size {gamma}`) and give its folder as DRAFT_MODEL_PATH; the launch scripts carry no "
            "drafter design flags.")


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


def cost_line(trials: list, exported) -> str:  # noqa: ANN001 - optuna FrozenTrials
    """Which source priced the study's trials, and how many needed AIC's nearest timed variant scaled by the
    roofline (a dtype AIC has not timed): a study is priced by one source, so its trials rank on one scale."""
    priced = [str(t.user_attrs["cost_source"]) for t in trials if t.user_attrs.get("cost_source") not in (None, "none")]
    if not priced:
        return "No trial was priced"
    bases = sorted({c.split(" (")[0] for c in priced})
    scaled = sum("x roofline ratio" in c for c in priced)
    line = f"Priced by {' and '.join(bases)}"
    if len(bases) > 1:
        line += " (MIXED cost sources: trials from different sources are not on one scale)"
    if scaled:
        line += (f"; {scaled} of {len(priced)} trials at a dtype AIC has not timed, priced as AIC's nearest timed "
                 "variant x the roofline's ratio")
    elif bases[0].startswith("aic:"):
        line += f"; all {len(priced)} trials on AIC's own timings (none needed the scaled fallback)"
    return line + f". The exported trial: {exported.user_attrs.get('cost_source', '?')}"


def varied_params(trials: list[Any]) -> list[str]:
    """The parameters that took more than one value over the completed trials: importances over the others would
    share out credit for changes that never happened."""
    seen: dict[str, set[str]] = {}
    for t in trials:
        for k, v in t.params.items():
            seen.setdefault(k, set()).add(repr(v))
    return sorted(k for k, vals in seen.items() if len(vals) > 1 and all(k in t.params for t in trials))


def _acceptance_plot(out: Path, trial: Any, params: dict[str, Any], profile: Profile,
                     evaluator: Evaluator) -> str:
    """acceptance.png: the tuned method's modelled (or measured) acceptance by position, DSpark's heads beside it;
    returns where the plotted acceptance comes from."""
    gamma = int(params["spec.block_size"])
    method = str(params.get("spec.method") or "dspark")
    modelled = {head: acceptance_for(profile, head).alphas(gamma) for head in ("none", "markov", "rnn")}
    if method != "dspark":  # the tuned method's own acceptance, DSpark's heads for reference
        mine = acceptance_of(profile, method)
        modelled = {method: mine.alphas(gamma), **{f"dspark ({h})": ys for h, ys in modelled.items()}}
    measured = trial.user_attrs.get("position_acceptance")
    if evaluator.mode in ("measure", "live") and measured:
        source = f"measured: trial {trial.number}, {params['spec.head']} head, gamma {gamma}"
        plots.acceptance({f"measured ({params['spec.head']} head)": list(measured)}, source, out / "acceptance.png",
                         reference={f"model prior ({h})": ys for h, ys in modelled.items()})
    else:
        source = (acceptance_for(profile, params["spec.head"]).source if method == "dspark" else
                  acceptance_of(profile, method).source)
        plots.acceptance(modelled, source, out / "acceptance.png")
    return source


ASSUMED_RANGE = 0.3  # the what-if on an assumed acceptance: tau this much lower and higher
MEASURE_IT = ("Measure the acceptance (`bench --record-acceptance`, or `monitor` a deployment and `profile "
              "--from-monitor`) before trusting the speedup.")


def assumed_acceptance(profile: Profile, params: dict[str, Any]) -> str | None:
    """Where the exported trial's acceptance comes from when nothing measured or published it for the deployed
    drafter on this model (a published prior of another model, or of the method in general); None when something
    did (a measurement, the drafter's catalogued figures, or a prior whose source names this model)."""
    if not params.get("spec.enabled", True):
        return None
    from tuner.acceptance import acceptance_of

    method = str(params.get("spec.method") or "dspark")
    source = acceptance_of(profile, method, str(params.get("spec.head") or "markov"),
                           int(params.get("spec.draft_layers") or 0) or None).source
    if not source.startswith("prior:"):
        return None  # measured here or on a deployment, or the drafter's own catalogued figures
    name = (profile.model.name or "").lower()
    # a published prior of this very model (the DSpark paper's Qwen3-8B rows for Qwen3-8B) is its published figure
    return None if name and name in source.lower() else source


def assumed_line(profile: Profile, params: dict[str, Any], evaluator: Evaluator, metrics: dict[str, float],
                 seed: int) -> str | None:
    """The report's warning when the acceptance is assumed: the source, and (simulated studies) the exported
    trial's throughput with tau 30% lower and higher, the range its figures rest on."""
    source = assumed_acceptance(profile, params)
    if source is None:
        return None
    line = (f"**Acceptance is assumed, not measured**: nothing measured or published the acceptance of the deployed "
            f"drafter on this model, so the figures rest on {source[len('prior: '):]}.")
    tau = metrics.get("tau")
    if evaluator.mode != "simulate" or not tau:
        return f"{line} {MEASURE_IT}"
    got = []
    for scale in (1 - ASSUMED_RANGE, 1 + ASSUMED_RANGE):
        evaluator.tau_scale = scale
        try:
            ev = evaluator.evaluate(params, seed=seed)
        finally:
            evaluator.tau_scale = 1.0
        got.append(ev.metrics.get("throughput") if ev.feasible else None)
    shown = [f"{v:,.0f}" if v else "infeasible" for v in got]
    return line + (f" With tau {tau * (1 - ASSUMED_RANGE):.2f}-{tau * (1 + ASSUMED_RANGE):.2f} (±30% of "
                   f"{tau:.2f}) the exported configuration gives {shown[0]}-{shown[1]} tok/s (predicted "
                   f"{metrics.get('throughput', 0):,.0f}). {MEASURE_IT}")


def running_line(profile: Profile, params: dict[str, Any], mode: str) -> str | None:
    """Why the running-request cap is what it is, against the workload's closed-loop clients (a cap of 1024 for 64
    clients was exported before: it never runs, and graphs captured for it waste memory and start-up time)."""
    from tuner.space import closed_loop_clients

    clients = 0 if mode == "live" else closed_loop_clients(profile.workload)
    cap = int(params.get("batch.max_requests") or 0)
    if not clients or not cap:
        return None
    if cap >= clients:
        return (f"at most {cap} at once, the workload's {clients} closed-loop clients: more never run, so the search "
                "caps it there. For more traffic, profile that load (`--concurrency`) and tune again")
    return (f"at most {cap} of the workload's {clients} requests in flight run at once (the tuned cap); the rest wait "
            "in the queue")


def layout_line(profile: Profile, params: dict[str, Any]) -> str | None:
    """What the exported layout does with the profiled devices: when it leaves some idle, how to use them as
    replicas, and why the bundle does not (the study simulated one replica at the whole load)."""
    from tuner.targets import replicas

    count = int(profile.hw.count or 0)
    if profile.hw.arch == "cpu" or count <= 1:
        return None
    tp = int(params.get("parallel.tp", 1))
    dp = replicas(profile, params)
    used = tp * dp
    line = f"tp {tp} x {dp} replica(s) = {used} of the {count} {profile.hw.name or 'devices'}"
    idle = count - used
    if idle < tp:
        return line + (f"; {idle} left idle (fewer than one more tp-{tp} replica)" if idle else "")
    more = count // tp
    return line + (f". {idle} are idle: the study simulated this layout carrying the whole load. To use them, serve "
                   f"{more} replicas (vLLM `--data-parallel-size {more}`, SGLang `--dp-size {more}`, or separate "
                   "servers behind a router); each then sees a share of the load, so tune again with `--gpus` "
                   "set to one replica's devices and the per-replica concurrency for its settings")
