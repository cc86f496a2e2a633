"""CLI of the tuner: `tune-kernels` (Triton kernel autotuning on the local GPU)."""

from __future__ import annotations

from typing import Annotated

import typer

from kb.cli_common import DbOpt, JsonOpt, console, err_console, print_json
from tuner.errors import TunerError


def register(app: typer.Typer) -> None:
    """Add the tuner's commands to the root app."""
    app.command("tune-kernels")(tune_kernels)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TunerError(f"{flag} {text!r} must be comma-separated integers, e.g. 1,16,64") from None
    if not values:
        raise TunerError(f"{flag} is empty; give at least one value, e.g. 1,16,64")
    return values


def tune_kernels(
    kernels: Annotated[list[str] | None, typer.Option("--kernels", help="Kernels to tune (repeat or comma-"
                                                      "separate; default all).")] = None,
    trials: Annotated[int, typer.Option(min=1, help="Optuna trials per kernel and shape bucket.")] = 30,
    batch: Annotated[str, typer.Option(help="Request batch sizes to tune for, comma-separated.")] = "1,16,64",
    gamma: Annotated[int, typer.Option(min=1, max=16, help="Draft block size (gamma).")] = 8,
    vocab: Annotated[int, typer.Option(min=2, help="Vocabulary size.")] = 151936,
    hidden: Annotated[int, typer.Option(min=1, help="Hidden size (RMSNorm).")] = 4096,
    inter: Annotated[int, typer.Option(min=1, help="MLP intermediate size (SwiGLU).")] = 12288,
    rank: Annotated[int, typer.Option(min=1, help="Markov head rank r.")] = 256,
    seed: Annotated[int, typer.Option(help="Sampler seed.")] = 0,
    plan: Annotated[int | None, typer.Option(help="Stored plan id (from `match`): search only inside its "
                                             "kernel.* rules.")] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Autotune the engine's Triton kernels on this GPU and store the winners in the knowledge base."""
    from tuner import kernels as kt

    names = kt.parse_kernels(kernels)
    batches = _ints(batch, "--batch")
    gpu, device_name = kt.local_gpu()  # TunerError (exit 2) without a GPU

    import torch
    import triton
    from rich.progress import Progress

    from dspark_core.kernels.spec import gpu_arch
    from kb.db import open_db, resolve_url

    jobs = kt.default_jobs(names, batches, gamma=gamma, vocab=vocab, hidden=hidden, inter=inter, rank=rank)
    database = open_db(db)
    plan_json = None
    if plan is not None:
        from kb.store import get_plan

        plan_json = get_plan(database, plan)
        for name in names:
            kt.plan_space(name, plan_json)  # an empty intersection fails before any GPU time is spent
    timer = kt.DoBenchTimer("cuda", seed=seed)
    arch = gpu_arch(torch.device("cuda"))
    with Progress(console=err_console, disable=json_out, transient=True) as bar:
        task = bar.add_task(f"tuning {len(jobs)} kernel shapes on {device_name}", total=len(jobs))
        results = kt.run_tuning(jobs, timer, gpu=gpu, arch=arch, n_trials=trials, db=database,
                                triton_version=triton.__version__, storage=resolve_url(db), seed=seed,
                                torch_timer=timer.torch_ms, plan=plan_json,
                                progress=lambda _job: bar.advance(task))
    if json_out:
        print_json({"gpu": device_name, "gpu_key": gpu, "arch": arch, "results": [r.as_json() for r in results]})
        return
    from rich.table import Table

    table = Table(title=f"Tuned kernels on {device_name} ({arch})")
    for col in ("kernel", "bucket", "config", "ms", "default ms", "torch ms", "vs torch"):
        table.add_column(col)
    for r in results:
        sp = r.speedup_vs_torch()
        table.add_row(r.kernel, r.bucket, " ".join(f"{k}={v}" for k, v in r.config.items()), f"{r.time_ms:.4f}",
                      f"{r.default_ms:.4f}" if r.default_ms else "-", f"{r.torch_ms:.4f}" if r.torch_ms else "-",
                      f"{sp:.2f}x" if sp else "-")
    console.print(table)
    console.print(f"stored {len(results)} configs for {gpu} in the knowledge base")
