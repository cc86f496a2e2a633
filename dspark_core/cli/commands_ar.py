"""CLI command `train-ar-draft`: the small AR draft model of a fetched target (dspark_core/training/train_ar.py).

It trains on the data `train-drafter` cached for the same target (target-generated continuations with the target's
top-K distributions), so run `train-drafter` for that target first; the slim draft is committed under
`dspark_core/assets/<model>/draft` and assembled into a full Hugging Face folder in the user cache.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from dspark_core.errors import DSparkError


def register(app: typer.Typer) -> None:
    app.command("train-ar-draft")(train_ar_draft_cmd)


def train_ar_draft_cmd(
    target: Annotated[str, typer.Option(help="A fetched model (smollm2-135m).")] = "smollm2-135m",
    layers: Annotated[int, typer.Option(min=1, help="Target layers kept (its first ones).")] = 1,
    intermediate_size: Annotated[int, typer.Option(min=1, help="MLP channels kept per layer.")] = 768,
    steps: Annotated[int, typer.Option(min=1, help="Optimiser steps.")] = 800,
    batch_seqs: Annotated[int, typer.Option(min=1, help="Sequences per step.")] = 8,
    positions: Annotated[int, typer.Option(min=1, help="Positions per sequence with a loss.")] = 64,
    lr: Annotated[float, typer.Option(min=0.0, help="Peak learning rate.")] = 1e-3,
    seed: Annotated[int, typer.Option(help="Seed of the data order.")] = 0,
    state_dir: Annotated[Path | None, typer.Option(help="train-drafter's state folder for this target (default: "
                                                   "user cache).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore a previous run's checkpoint.")] = False,
    max_minutes: Annotated[float, typer.Option(min=0.0, help="Stop after this long (0 = no limit); a rerun "
                                               "resumes.")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Distil a small AR draft model from a fetched target (for assisted generation and draft_model peers)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dspark_core.cli.commands_dspark import _emit, _load_target, target_data, train_root
    from dspark_core.config import MODEL_ASSETS
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from dspark_core.modeling.models_fetch import name_of
    from dspark_core.training.train import DATA_FILE, load_state
    from dspark_core.training.train_ar import (
        STATE_FILE,
        ARSpec,
        cut_target,
        distill,
        ensure_draft,
        greedy_agreement,
        save_slim,
    )

    folder = checkpoint_folder(target)
    name = name_of(folder)
    if name is None:
        raise DSparkError(f"--target {target} is not a fetched model; AR drafts are committed for those only")
    root = state_dir or train_root(folder)
    data_file = root / DATA_FILE
    if not data_file.is_file():
        raise DSparkError(f"no training data at {data_file}: run `python cli.py train-drafter --target {name}` first "
                          "(the AR draft trains on the same target-generated data)")
    cached = load_state(data_file)
    data, meta = cached["data"], cached["meta"]
    work = root / "ar"
    work.mkdir(parents=True, exist_ok=True)
    if fresh:
        (work / STATE_FILE).unlink(missing_ok=True)
    spec = ARSpec(layers=layers, intermediate=intermediate_size, steps=steps, batch_seqs=batch_seqs,
                  positions=positions, lr=lr, seed=seed)
    tgt = _load_target(folder, "cpu", str(meta.get("dtype", "fp32")))
    student = cut_target(tgt, spec)
    held = target_data(tgt, folder, sequences=32, prompt_len=int(meta["prompt_len"]), gen_len=64,
                       greedy_fraction=1.0, temperature=0.0, seed=seed + 1, heldout=True)
    before = greedy_agreement(student, tgt, held)
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*cols, disable=as_json) as progress:
        task = progress.add_task("distil AR draft", total=steps, loss=float("nan"))
        ema: list[float] = []

        def on_step(step: int, loss: float) -> None:
            ema[:] = [loss if not ema else 0.9 * ema[0] + 0.1 * loss]
            progress.update(task, completed=step, loss=ema[0])
            if not progress.console.is_terminal and step % 100 == 0:
                progress.console.print(f"distil AR draft: step {step}/{steps} loss {ema[0]:.3f}")

        deadline = time.time() + 60 * max_minutes if max_minutes > 0 else None
        student = distill(student, data, spec, work, on_step=on_step, deadline=deadline)
    after = greedy_agreement(student, tgt, held)
    out = save_slim(student, MODEL_ASSETS / name / "draft", spec)
    full = ensure_draft(name, folder)
    params = sum(p.numel() for n, p in student.named_parameters() if not n.startswith(("embed", "lm_head")))
    result = {"out": str(out), "assembled": str(full), "own_params": params,
              "heldout_greedy_agreement": round(after, 4), "heldout_greedy_agreement_before": round(before, 4),
              "final_loss": ema[0] if ema else None}
    _emit(result, as_json, [f"AR draft ({params / 1e6:.2f} M own params + the target's embedding) -> {out}",
                            f"assembled for the peers -> {full}",
                            f"held-out greedy agreement with the target: {before:.3f} cut -> {after:.3f} distilled"])
