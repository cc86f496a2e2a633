"""`python cli.py profile`: model + hardware + workload profile, printed and stored in the KB."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from kb.cli_common import DbOpt, JsonOpt, console, err_console, print_json

if TYPE_CHECKING:
    from profiler.workload import Traffic

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Catalogue name (qwen3, qwen3-30b-a3b, llama-3.1-70b, ...), a config.json, a model "
                          "folder, an .onnx file, or 'tiny' (the project's reference target).")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", "-g", help="Catalogue GPU (h100, H100-SXM, a100-80gb, mi300x, ...) or 'auto' to detect and "
                        "micro-benchmark this machine.")]
WorkloadOpt = Annotated[str | None, typer.Option(
    "--workload", "-w", help="Preset (chat, code, math, mixed) or a JSONL file of requests. Default: chat.")]

ConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", help="Requests in flight (closed-loop clients), replacing the workload's.")]
SloTtftOpt = Annotated[float | None, typer.Option(
    "--slo-ttft-ms", help="p99 time-to-first-token SLO in ms, replacing the workload's (0: none).")]
SloTpotOpt = Annotated[float | None, typer.Option(
    "--slo-tpot-ms", help="p99 time-per-output-token SLO in ms, replacing the workload's (0: none).")]
DrafterOpt = Annotated[str | None, typer.Option(
    "--drafter", help="Drafter the deployment runs: auto (the model's published drafter, first of dspark > eagle3 > "
                      "mtp > dflash > draft_model), none (train a DSpark one for the tuned configuration), a method "
                      "(dspark, eagle3, mtp, dflash, draft_model: its published drafter; ngram, suffix: no "
                      "checkpoint), a catalogue drafter id (--list-drafters) or a DSpark drafter folder.")]


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile(
        model: ModelOpt = None,
        gpu: GpuOpt = None,
        workload: WorkloadOpt = None,
        json_out: JsonOpt = False,
        db: DbOpt = None,
        name: Annotated[str | None, typer.Option(help="Name to store the profile under.")] = None,
        store: Annotated[bool, typer.Option("--store/--no-store", help="Store the profile in the KB.")] = True,
        measure: Annotated[bool, typer.Option("--measure/--no-measure",
                                              help="Run microbenchmarks with --gpu auto.")] = True,
        entropy: Annotated[bool | None, typer.Option(
            "--entropy/--no-entropy", help="Measure the target's next-token entropy on the workload with a "
                                           "runnable model (default: only with --gpu auto).")] = None,
        quality: Annotated[str | None, typer.Option(
            "--quality", help="Accuracy floor: standard (default: 8-bit weights at most) or relaxed (4-bit "
                              "weights allowed; check their accuracy on your workload first).")] = None,
        gpus: Annotated[int | None, typer.Option(
            "--gpus", help="Devices the deployment has (sets hw.count; default: not stated, the tuner then "
                           "searches TP over one 8-GPU node).")] = None,
        concurrency: ConcurrencyOpt = None,
        slo_ttft_ms: SloTtftOpt = None,
        slo_tpot_ms: SloTpotOpt = None,
        drafter: DrafterOpt = None,
        from_monitor: Annotated[bool, typer.Option(
            "--from-monitor", help="Take acceptance (tau, by position, per head) from a monitored deployment "
                                   "instead of committed measurements or priors: the next tune uses it.")] = False,
        deployment: Annotated[str, typer.Option(help="With --from-monitor: the deployment id, or latest.")
                              ] = "latest",
        list_models: Annotated[bool, typer.Option("--list-models", help="List the model catalogue.")] = False,
        list_gpus: Annotated[bool, typer.Option("--list-gpus", help="List the GPU catalogue.")] = False,
        list_drafters: Annotated[bool, typer.Option(
            "--list-drafters", help="List the drafter catalogue (with --model: that model's drafters).")] = False,
    ) -> None:
        """Profile a model, a GPU and a workload: sizes, bytes, FLOPs, operator census, what bounds decode."""
        if list_drafters:
            _list_drafters(model, json_out)
            return
        if list_models or list_gpus:
            _list(list_models, list_gpus, json_out)
            return
        if not model and not gpu:
            from profiler.errors import ProfileError

            raise ProfileError("nothing to profile: give --model and/or --gpu (see --list-models, --list-gpus)")
        from profiler.workload import Traffic

        p = _build_with_progress(model, gpu, workload, measure, entropy, quiet=json_out, quality=quality,
                                 gpus=gpus, traffic=Traffic(concurrency, slo_ttft_ms, slo_tpot_ms), drafter=drafter)
        from profiler.line_safe import profile_problem  # values the launch scripts carry: one line each

        if (why := profile_problem(p)) is not None:
            from profiler.errors import ProfileError

            raise ProfileError(why)
        if from_monitor:
            from kb.db import open_db
            from kb.deployments import monitored_acceptance

            database = open_db(db)
            try:
                p.accept = monitored_acceptance(database, deployment, p.workload.domain)
            finally:
                database.dispose()
        profile_id = None
        if store:
            from kb.db import open_db
            from kb.store import save_profile

            database = open_db(db)
            try:
                profile_id = save_profile(database, p, name=name)
            finally:
                database.dispose()
        if json_out:
            print_json(p.model_dump(mode="json", exclude_none=True))
            if profile_id is not None:
                err_console.print(f"stored as profile {profile_id}")
            return
        from profiler.summary import render_profile

        render_profile(p, console, profile_id)


def _build_with_progress(model: str | None, gpu: str | None, workload: str | None, measure: bool,
                         entropy: bool | None, quiet: bool, quality: str | None = None,
                         gpus: int | None = None, traffic: Traffic | None = None,
                         drafter: str | None = None):  # -> Profile
    """build_profile with a progress bar on stderr while micro-benchmarks / entropy run."""
    from profiler.build import build_profile

    slow = (gpu or "").lower() == "auto" and measure or bool(entropy)
    if not slow:
        return build_profile(model, gpu, workload, measure=measure, entropy=entropy, quality=quality, gpus=gpus,
                             traffic=traffic, drafter=drafter)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from profiler.hardware import MICROBENCH_STEPS

    total = MICROBENCH_STEPS if (gpu or "").lower() == "auto" and measure else 0
    total += 1 if entropy or ((gpu or "").lower() == "auto" and measure and entropy is None) else 0
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err_console, transient=quiet) as bar:
        task = bar.add_task("profiling", total=max(total, 1))

        def step(msg: str) -> None:
            bar.update(task, advance=1, description=msg)

        return build_profile(model, gpu, workload, measure=measure, entropy=entropy, progress=step,
                             quality=quality, gpus=gpus, traffic=traffic, drafter=drafter)


def _list(list_models: bool, list_gpus: bool, json_out: bool) -> None:
    from profiler.catalog import gpus, models

    if json_out:
        out: dict[str, object] = {}
        if list_models:
            out["models"] = [{"name": m.name, "family": m.family, "aliases": m.aliases,
                              "default_for": m.default_for, "source": m.source, "config_file": m.config_file}
                             for m in models()]
        if list_gpus:
            out["gpus"] = [g.model_dump() for g in gpus()]
        print_json(out)
        return
    from profiler.summary import gpus_table, models_table

    if list_models:
        console.print(models_table())
    if list_gpus:
        console.print(gpus_table())


def _list_drafters(model: str | None, json_out: bool) -> None:
    """The drafter catalogue (profiler/catalog/drafters.yaml), or one catalogue model's drafters in auto's order.
    The human form is one heading per target and one line per drafter, so an id is never cut at any width."""
    from rich.markup import escape

    from profiler.catalog import drafters, drafters_for, models, resolve_model

    targets = [resolve_model(model)[0].name] if model else [m.name for m in models()]
    rows = [d for t in targets for d in drafters_for(t)]
    if not model:
        rows += [d for d in drafters() if d not in rows]  # a target outside the model catalogue (none today)
    if json_out:
        print_json({"drafters": [d.model_dump(exclude_none=True) for d in rows]})
        return
    console.print("[bold]Published drafters[/bold] (profiler/catalog/drafters.yaml; `--drafter` takes the method or "
                  "the id; --json for every fact)")
    for target in dict.fromkeys(d.target for d in rows):
        console.print(f"[bold]{escape(target)}[/bold]")
        for d in (d for d in rows if d.target == target):
            steps = sorted({a.steps for a in d.acceptance})
            acc = (f"{len(d.acceptance)} published at K {'/'.join(map(str, steps))}" if d.acceptance else
                   f"DSpark paper Table 1 at K {d.acceptance_ref.steps}" if d.acceptance_ref else "no acceptance")
            console.print(f"  {d.method:<11} {escape(d.id)}  [dim]({acc})[/dim]", soft_wrap=True)
    if model and not rows:
        console.print(f"no published drafter for {escape(targets[0])}: --drafter ngram, suffix or none")
