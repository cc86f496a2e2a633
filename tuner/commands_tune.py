"""CLI of the tuner: `tune` (profile -> plan -> Optuna study -> bundle) and `export`."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from kb.cli_common import DbOpt, JsonOpt, RulesOpt, console, err_console, print_json
from kb.commands_profile import ConcurrencyOpt, DrafterOpt, SloTpotOpt, SloTtftOpt
from tuner.errors import TunerError
from tuner.live.options import check_live_options, live_deploy, live_spec, live_workers
from tuner.tune_progress import study_with_progress, with_bar

if TYPE_CHECKING:
    from profiler.workload import Traffic

LOCAL_GPUS = ("auto", "cpu", "local")


def default_deploy(mode: str, profile) -> str:  # noqa: ANN001 - profiler.schema.Profile
    """The bundle's engines when --deploy is not given: a study measured on this CPU ran the bundled engine, which
    is the one that serves on a CPU here (SGLang needs a GPU), so it searches what that engine runs; else both
    serving stacks."""
    return "dspark" if mode == "measure" and profile.hw.arch == "cpu" else "both"


def _slug(s: str | None) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (s or "x").lower()).strip("-")[:24] or "x"


def _model_ref(profile) -> str | None:
    src = profile.model.source
    if src and Path(src).exists():
        return src
    return profile.model.name


def _gpu_ref(profile) -> str | None:
    """How to name a stored profile's hardware again: a catalogue GPU by its name, this machine's CPU
    (stored as e.g. 'cpu: AMD EPYC ...', which is no catalogue name) as `cpu`."""
    if profile is None or profile.hw is None:
        return None
    if profile.hw.arch == "cpu":
        return "cpu"
    return profile.hw.name


def resolve_profile(database, model: str | None, gpu: str | None, workload: str | None,
                    traffic: Traffic | None = None, drafter: str | None = None, gpus: int | None = None):
    """The profile to tune: the latest stored one, with --model/--gpu/--workload and the traffic options
    (`profiler.workload.Traffic`) overriding parts. What is not overridden is carried over from the stored
    profile: its workload as profiled (a preset's or a file's figures, the user's SLOs), its accuracy floor
    and its device count (unless `gpus` is given), so `profile --slo-tpot-ms 20 && tune --gpu h100` tunes for 20 ms
    on H100s."""
    from kb.store import latest_profile, save_profile
    from profiler.build import build_profile

    latest = latest_profile(database)
    given = bool(model or gpu or workload or drafter or gpus or (traffic is not None and traffic.given()))
    if latest is None and not model:
        raise TunerError("no stored profile and no --model; run 'dspark profile --model NAME' first or pass --model")
    if latest is not None and not given:
        _refuse_unsafe(latest[1])  # stored before this check existed, or by another tool
        return latest
    base = latest[1] if latest else None
    base_wl = None
    if base is not None and not workload:
        base_wl = base.workload
        if model and base_wl.entropy is not None and model != _model_ref(base):  # measured with the old target
            base_wl = base_wl.model_copy(update={"entropy": None})
    hw_ref = gpu or _gpu_ref(base)
    same_model = base is not None and (not model or model == _model_ref(base))
    profile = build_profile(model=model or _model_ref(base), gpu=hw_ref,
                            workload=workload or base_wl, measure=(hw_ref or "").lower() in LOCAL_GPUS,
                            quality=base.workload.quality if base else None,
                            gpus=gpus or (base.hw.count if base and base.hw else None), traffic=traffic,
                            drafter=drafter or (base.drafter.chosen if same_model and base else None))
    _keep_production_acceptance(database, profile)
    _refuse_unsafe(profile)
    return save_profile(database, profile), profile


def _refuse_unsafe(profile) -> None:  # noqa: ANN001 - profiler.schema.Profile
    """One line, before anything is stored or run, when a value the launch scripts carry (the model's folder name
    and path, the drafter's path, the GPU's name) holds a line-breaking character (profiler/line_safe.py)."""
    from profiler.line_safe import profile_problem

    why = profile_problem(profile)
    if why:
        raise TunerError(why)


def _refuse_unsafe_options(**options: str | None) -> None:
    """One line when an option's value holds a line-breaking character: it would reach a launch script."""
    from profiler.line_safe import unsafe_char

    for name, value in options.items():
        why = unsafe_char(value) if value else None
        if why:
            raise TunerError(f"--{name}: {ascii(value)[1:-1][:80]} holds {why}; rename it (launch scripts carry it)")


def _from_production(p) -> bool:  # noqa: ANN001 - profiler.schema.Profile
    """The profile's acceptance was measured on a live deployment (`profile --from-monitor`)."""
    return (p.accept.source or "").startswith("measured: monitor ")


def _keep_production_acceptance(database, profile) -> None:  # noqa: ANN001 - kb Database, profiler Profile
    """A deployment's measured acceptance of this model, drafter and workload domain holds on any GPU and
    whatever flags repeat the profile: it replaces what a fresh profile took (a published prior, a catalogue figure
    or a bench of the committed drafter: the deployment ran the real traffic). The profile's content, and so the
    study, changes with it: a tune after `profile --from-monitor` is a new study, not a resumed one that runs no
    trial."""
    from kb.store import latest_production

    prod = latest_production(database, profile.model.name, profile.drafter.chosen, profile.workload.domain or None)
    if prod is not None:
        profile.accept = prod.accept


def _default_study(profile, plan_json: dict[str, Any], mode: str, objectives: list[str], seed: int,
                   cost: str = "roofline", calibration: dict[str, Any] | None = None,
                   deploy: str | None = None, cluster: dict[str, Any] | None = None,
                   measured: tuple[bool, int] = (False, 48)) -> str:
    key = [profile.content_hash(), plan_json.get("space"), plan_json.get("fixed"), mode, objectives, seed]
    if mode == "measure" and measured != (False, 48):  # compiled or longer trials measure another engine run
        key.append(f"compile={measured[0]},tokens={measured[1]}")  # (eager 48-token studies keep their names)
    if cluster is not None:  # the same server of another deployment is another study
        key.append(cluster)
    if deploy is not None:  # the searched space depends on it (tuner/deploy.py)
        key.append(f"deploy={deploy}")
    if mode == "simulate" and cost != "roofline":  # (roofline studies keep the names they had before AIC)
        key.append(cost)
    if calibration:  # (uncalibrated studies keep their names)
        key.append(calibration.get("source"))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return "-".join([_slug(profile.model.name), _slug(profile.hw.name), _slug(profile.workload.name or
                                                                              profile.workload.domain), mode,
                     digest[:6]])


def _cost(cost: str, profile) -> str:
    """The cost model a new simulated study uses: --cost aic must be available, auto takes it when it is."""
    if cost == "roofline":
        return "roofline"
    from tuner.aic import covers

    target, why = covers(profile)
    if target is None and cost == "aic":
        raise TunerError(f"--cost aic: {why}")
    return "aic" if target is not None else "roofline"


def _confirm(study, k: int, quiet: bool) -> None:  # noqa: ANN001 - optuna.Study
    """A live study's finalists measured again (tuner/live/confirm.py), with a progress bar."""
    from tuner import study as st
    from tuner.live.confirm import confirm

    spec = st.StudySpec.model_validate(study.user_attrs[st.SPEC_ATTR])
    if spec.mode != "live" or k <= 0 or spec.objectives[0] != "throughput":
        return
    with_bar("confirming the best on fresh servers", quiet, lambda step: confirm(study, spec, k, on_step=step))


def _isolate(study, db_url: str, quiet: bool) -> dict | None:  # noqa: ANN001 - optuna.Study
    """--isolate: the exported configuration alone and beside busy neighbours (tuner/live/isolate.py)."""
    from tuner import study as st
    from tuner.live.isolate import isolation

    spec = st.StudySpec.model_validate(study.user_attrs[st.SPEC_ATTR])
    return with_bar("--isolate: the best alone, then beside busy neighbours", quiet,
                     lambda step: isolation(study, spec, db_url, on_step=step))


def tune(gpu: Annotated[str | None, typer.Option(help="GPU to tune for (catalogue name, or auto/cpu = this "
                                                       "device). Default: the stored profile's.")] = None,
         model: Annotated[str | None, typer.Option(help="Model name or path (default: the stored profile's).")] = None,
         workload: Annotated[str | None, typer.Option(help="Workload preset or JSONL file.")] = None,
         study_name: Annotated[str | None, typer.Option("--study", help="Study name; an existing one resumes.")] = None,
         mode: Annotated[str, typer.Option(help="auto (measure on this device, simulate otherwise), "
                                                "simulate or measure.")] = "auto",
         objective: Annotated[str, typer.Option(help="Comma-separated objectives: throughput, tpot_p99, "
                                                     "ttft_p99, tau.")] = "throughput,tpot_p99",
         trials: Annotated[int, typer.Option(min=1, help="Completed trials the study should reach.")] = 40,
         timeout: Annotated[float | None, typer.Option(help="Seconds per worker before stopping early.")] = None,
         seed: Annotated[int, typer.Option(help="Sampler and simulation seed.")] = 0,
         workers: Annotated[int | None, typer.Option(min=1, max=256, help="Worker processes on this machine "
                                                     "(default 1; with --devices, one per device).")] = None,
         trial_seconds: Annotated[float, typer.Option(min=1.0, help="Measure mode: stop a trial's generation "
                                                      "after this many seconds and score what it did.")] = 60.0,
         trial_tokens: Annotated[int, typer.Option(min=8, max=4096, help="Measure mode: new tokens each of a trial's "
                                                   "requests generates (n-gram and suffix copy from the output: "
                                                   "longer trials see more of it).")] = 48,
         compile_steps: Annotated[bool | None, typer.Option("--compile/--no-compile", help="Measure mode: the "
                                                            "trials' engine runs compiled decode / verify steps "
                                                            "(compiled before each is timed, cached on disk) and the "
                                                            "bundle's dspark.yaml says so (default: on where "
                                                            "torch.compile can build them).")] = None,
         concurrency: ConcurrencyOpt = None, slo_ttft_ms: SloTtftOpt = None, slo_tpot_ms: SloTpotOpt = None,
         drafter: DrafterOpt = None,
         cost: Annotated[str, typer.Option(help="Simulate: what prices a forward. auto (AIConfigurator's measured "
                                                "kernels when the aic extra covers the GPU and model, else the "
                                                "roofline), aic or roofline.")] = "auto",
         engine: Annotated[str | None, typer.Option(help="Tune against a live serving engine launched per trial on "
                                                         "this machine: dspark (our serve), vllm or sglang.")] = None,
         devices: Annotated[str | None, typer.Option(help="--engine: this machine's devices the trials' servers "
                                                       "share, one server per group of TP x DP devices, side by "
                                                       "side (0-7, 0,1,2,3 or auto).")] = None,
         engine_python: Annotated[Path | None, typer.Option(help="--engine: the Python that has vLLM or SGLang "
                                                                 "(default: found on PATH).")] = None,
         draft: Annotated[str | None, typer.Option(help="--engine vllm: a small autoregressive draft model folder, "
                                                        "which adds vLLM's draft_model method to the search.")] = None,
         trial_requests: Annotated[int | None, typer.Option(min=1, help="--engine: requests per trial (default: 3 "
                                                            "per client, at least 16).")] = None,
         trial_max_tokens: Annotated[int | None, typer.Option(min=1, help="--engine: cap on each request's output "
                                                              "tokens (default: the workload's lengths).")] = None,
         startup_seconds: Annotated[float, typer.Option(min=1.0, help="--engine: a server not healthy after this "
                                                        "long is a failed trial.")] = 600.0,
         hot_trials: Annotated[int, typer.Option(min=0, help="--engine: after the screen, trials that vary only "
                                                 "the settings a running server takes without a restart, on each "
                                                 "newly started one (dspark: the verify-length settings).")] = 2,
         confirm: Annotated[int, typer.Option(min=0, help="--engine: measure the N best configurations once "
                                              "more, each on a fresh server, and export the best mean (the best "
                                              "single trial is partly the luckiest draw).")] = 3,
         isolate: Annotated[bool, typer.Option(help="--engine with --devices: after the study, measure the best "
                                               "configuration alone and beside every other group under the same "
                                               "load, and report what neighbours cost.")] = False,
         load: Annotated[str, typer.Option(help="--engine: closed (closed loop at the profiled concurrency) or sweep "
                                                "(then open-loop rates below it: throughput at the SLOs).")] = "closed",
         calibrated: Annotated[bool, typer.Option("--calibration/--no-calibration", help="Simulate: scale times by "
                                                  "the latest live study's calibration of this hardware.")] = True,
         out: Annotated[Path, typer.Option(help="Bundle folder (written atomically).")] = Path("out"),
         deploy: Annotated[str | None, typer.Option(help="The engine(s) the bundle is for: sglang, vllm, both, or "
                                                    "dspark (the bundled engine only: its methods include suffix "
                                                    "and the DSpark + suffix hybrid). Default: dspark for a study "
                                                    "measured on this CPU, else both; a resumed study keeps its "
                                                    "own. The search holds only what they run; only their scripts "
                                                    "are exported.")] = None,
         gpus: Annotated[int | None, typer.Option(min=1, help="GPUs of the deployment (default: the stored "
                                                  "profile's); with --serving, the whole cluster's.")] = None,
         serving: Annotated[str | None, typer.Option(help="Plan the deployment across --gpus first: agg (replicas "
                                                     "behind a router), disagg (prefill / decode workers) or auto "
                                                     "(the better of both); then tune the server that decodes and "
                                                     "export every worker's launch script.")] = None,
         nodes: Annotated[int | None, typer.Option(min=1, help="--serving: nodes the GPUs are on (default: nodes "
                                                   "of eight).")] = None,
         db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Tune DSpark for a model, GPU and workload, then export the deployable bundle."""
    from kb.commands import open_synced
    from kb.db import resolve_url
    from kb.errors import PlanConflict
    from kb.match import match_profile
    from kb.store import save_plan
    from kb.sync import enabled_rules
    from tuner import study as st
    from tuner.bundle_dir import check_out
    from tuner.export import export_study
    from tuner.measure import check_resumed_compile, resolve_compile, start_dtype, steps_line

    objectives = [o.strip() for o in objective.split(",") if o.strip()]
    st.directions(objectives)
    if mode not in ("auto", "simulate", "measure", "live"):
        raise TunerError(f"--mode {mode!r}: choose auto, simulate, measure or live (with --engine)")
    if cost not in ("auto", "aic", "roofline"):
        raise TunerError(f"--cost {cost!r}: choose auto, aic or roofline")
    if engine is not None:
        from tuner.live.engines import ENGINES

        if engine not in ENGINES:
            raise TunerError(f"--engine {engine!r}: choose {', '.join(ENGINES)}")
        if mode not in ("auto", "live"):
            raise TunerError(f"--engine measures a live engine: drop --mode {mode}")
        check_live_options(engine, engine_python, draft)  # before the profile: a typo costs no measurement
    elif mode == "live":
        raise TunerError("--mode live needs --engine dspark|vllm|sglang")
    workers, device_ids = live_workers(devices, workers, engine)
    if isolate:
        from tuner.live.isolate import check_isolate

        check_isolate(device_ids, engine)
    if load not in ("closed", "sweep"):
        raise TunerError(f"--load {load!r}: choose closed or sweep")
    if serving is not None:
        from tuner.cluster_tune import check_serving

        check_serving(serving, engine, mode)
    elif nodes is not None:
        raise TunerError("--nodes places the GPUs of a planned deployment: add --serving agg|disagg|auto")
    if deploy is not None:
        from tuner.deploy import check

        check(deploy)
        live_deploy(engine, deploy)
    check_out(out)  # before any trial runs, not after the whole study
    if study_name is not None:
        st.check_name(study_name)
    _refuse_unsafe_options(model=model, drafter=drafter, draft=draft)
    database, _ = open_synced(db, rules)
    url = resolve_url(db)
    from profiler.workload import Traffic

    traffic = Traffic(concurrency, slo_ttft_ms, slo_tpot_ms)
    resume = study_name is not None and not (model or gpu or workload or drafter or gpus or serving or
                                             traffic.given()) and _exists(url, study_name)
    if resume:  # a study stored before these checks existed: refused before its trials, not at its export
        stored = st.StudySpec.model_validate(st.open_study(url, study_name, None).user_attrs[st.SPEC_ATTR])
        _refuse_unsafe(stored.profile_model())
        _refuse_unsafe_options(draft=stored.draft)
        check_resumed_compile(compile_steps, stored.mode, stored.compile, study_name)
        if deploy is not None and deploy != (stored.deploy or "both"):
            raise TunerError(f"study {study_name} was tuned for --deploy {stored.deploy or 'both'}; drop --deploy to "
                             f"resume it, or give a new --study for --deploy {deploy}")
    else:
        here = "auto" if engine is not None and gpu is None else gpu  # a live engine runs on this machine
        choice = None
        if serving is not None:  # the deployment first, then its decoding server is what the study tunes
            from tuner.cluster_tune import plan_deployment

            choice, (profile_id, profile) = plan_deployment(database, model, here, workload, traffic, drafter, gpus,
                                                            nodes, serving, cost, quiet=as_json)
        else:
            profile_id, profile = resolve_profile(database, model, here, workload, traffic, drafter, gpus)
        try:
            plan = match_profile(enabled_rules(database), profile)
        except PlanConflict as e:
            raise TunerError(f"no plan for this profile: {e}") from None
        if choice is not None:
            plan = choice.pin(plan)
        plan_json = plan.model_dump(mode="json")
        plan_id = save_plan(database, profile_id, plan_json, plan.rule_refs())
        local = (profile.hw.arch == "cpu") or (gpu or "").lower() in LOCAL_GPUS
        chosen = "live" if engine else mode if mode != "auto" else ("measure" if local else "simulate")
        priced = _cost(cost, profile) if chosen == "simulate" else "roofline"
        slo = profile.workload.slo
        from importlib.metadata import PackageNotFoundError, version

        try:
            tool = version("dspark-tune")
        except PackageNotFoundError:
            tool = "source"
        spec = st.StudySpec(profile=profile.model_dump(mode="json", exclude_none=True), profile_id=profile_id,
                            plan=plan_json, plan_id=plan_id, mode=chosen, objectives=objectives,
                            slo_ttft_ms=slo.ttft_ms if slo else None, slo_tpot_ms=slo.tpot_ms if slo else None,
                            seed=seed, tool_version=tool, trial_seconds=trial_seconds, trial_tokens=trial_tokens,
                            compile=resolve_compile(compile_steps, profile.hw.arch, chosen),
                            cost=priced,
                            deploy=deploy or live_deploy(engine) or default_deploy(chosen, profile),
                            cluster=choice.to_json() if choice is not None else None)
        if chosen != "live":
            searched = spec.space()  # a deploy that leaves nothing runnable is one line now, not in the first trial
            if chosen == "measure":  # the screen compares the methods in the dtype this CPU runs faster
                spec.start_dtype, why = start_dtype(profile, searched, spec.compile)
                if why and not as_json:
                    err_console.print(f"{why}: the screen starts there", highlight=False)
        if chosen in ("simulate", "live") and calibrated:
            from tuner.live.calibration import lookup

            spec.calibration = lookup(database, profile.hw.name, profile.model.name)
        if engine is not None:
            spec = live_spec(spec, engine, engine_python, draft, trial_requests, trial_max_tokens, startup_seconds,
                              quiet=as_json).model_copy(update={"live_load": load, "hot_trials": hot_trials})
        study_name = study_name or _default_study(profile, plan_json, chosen, objectives, seed, priced,
                                                  spec.calibration, spec.deploy, spec.cluster,
                                                  (spec.compile, spec.trial_tokens))
        st.open_study(url, study_name, spec)
    if not as_json and not resume and spec.mode == "measure":
        err_console.print(steps_line(spec.compile), highlight=False)
    if not as_json:
        shown = escape(study_name)  # a name or path with [brackets] is text, not Rich markup
        err_console.print(f"study [bold]{shown}[/] in {escape(_shown(url))}: Ctrl-C keeps every completed trial; "
                          f"resume with --study {shown}")
    if device_ids is not None:
        from tuner.live.devices import DEVICES_ENV

        os.environ[DEVICES_ENV] = ",".join(map(str, device_ids))  # this process's and its workers' evaluators
        if not as_json:
            err_console.print(f"devices {os.environ[DEVICES_ENV]}: up to {workers} servers side by side, each on "
                              "its own group (the finalists are confirmed one at a time, alone on this machine)",
                           highlight=False)
    try:
        done = study_with_progress(url, study_name, trials, workers, timeout, as_json)
        _confirm(done, confirm, as_json)
        isolated = _isolate(done, url, as_json) if isolate else None
    except KeyboardInterrupt:
        n = len(st.completed(st.open_study(url, study_name, None)))
        err_console.print(f"interrupted: study {escape(study_name)} keeps its {n} completed trials; resume with "
                          f"--study {escape(study_name)}", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    stored = st.StudySpec.model_validate(done.user_attrs[st.SPEC_ATTR])
    if not as_json and stored.mode == "measure":
        err_console.print("exporting: profiling the steps-per-second table of the chosen configuration on this device "
                          "(every verify batch size it may run; minutes on a CPU) ...", highlight=False)
    result = export_study(url, study_name, out)
    summary = {"study": study_name, "trials": len(st.completed(done)), **result.to_json()}
    _warn_assumed(stored, result.params)
    if stored.mode == "live":
        from tuner.live.calibration import store

        if not as_json:
            err_console.print("calibrating the simulator on the measured trials ...", highlight=False)
        fit = store(database, study_name, stored, st.completed(done))
        if fit is not None:
            summary["calibration"] = fit
    if isolated is not None:
        summary["isolation"] = isolated
    if as_json:
        print_json(summary)
    else:
        from tuner.tune_summary import print_summary

        print_summary(summary)
    if not result.meets_slo:
        raise TunerError(f"no configuration met the SLOs in {summary['trials']} trials; {out}/ holds the closest "
                         "one and report.md says by how much (loosen the SLOs, add GPUs or change the workload)")


def _warn_assumed(spec, params: dict) -> None:  # noqa: ANN001 - tuner.study.StudySpec
    """One warning line when the exported trial's acceptance is assumed (nothing measured or published it for the
    deployed drafter on this model): report.md's first lines give the range its figures rest on."""
    from tuner.report import assumed_acceptance

    source = assumed_acceptance(spec.profile_model(), params)
    if source is not None:
        err_console.print(f"[yellow]warning:[/] the acceptance of the deployed drafter is assumed ({source}); "
                          "report.md shows the throughput at tau ±30%. Measure it before trusting the speedup.",
                          highlight=False, soft_wrap=True)


def _shown(url: str) -> str:
    from kb.db import _redact

    return _redact(url)


def _exists(url: str, name: str) -> bool:
    import optuna

    from tuner.study import storage

    return name in {s.study_name for s in optuna.get_all_study_summaries(storage(url))}


def export(study_name: Annotated[str, typer.Option("--study", help="Study to export.")],
           out: Annotated[Path, typer.Option(help="Bundle folder (written atomically).")] = Path("out"),
           trial: Annotated[int | None, typer.Option("--trial", min=0, help="Export this completed trial (e.g. a "
                                                     "Pareto-front point) instead of the best one.")] = None,
           db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Re-export a study's best configuration (or `--trial N`) as a bundle."""
    from kb.db import open_db, resolve_url
    from tuner.export import export_study
    from tuner.study import check_name

    check_name(study_name)
    open_db(db)
    result = export_study(resolve_url(db), study_name, out, trial)
    if as_json:
        print_json(result.to_json())
    else:
        console.print(f"exported trial {result.trial_number} of {escape(study_name)} to {escape(str(out))}/ "
                      f"({'meets' if result.meets_slo else 'does NOT meet'} the SLOs)")


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
    app.command("export")(export)
