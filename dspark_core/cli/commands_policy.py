"""CLI command `train-policy`: the learned verification-length scheduler from round logs
(dspark_core/training/train_policy.py; the scheduler is dspark_core/verification/learned.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("train-policy")(train_policy_cmd)


def train_policy_cmd(
    logs: Annotated[list[Path], typer.Argument(help="Round logs (JSONL written with spec.round_log, ideally under "
                                               "spec.scheduler=verify_all: full information).")],
    out: Annotated[Path, typer.Option(help="Policy JSON to write (spec.policy_path).")] = Path("policy.json"),
    heldout: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of each log's last rounds kept out of "
                                           "training to compare the policies on.")] = 0.2,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Train `spec.scheduler: learned` from logged rounds; compare it with verify_all and prefix on held-out ones."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dspark_core.training.train_policy import load_rounds, train_policy

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    data = load_rounds(logs)
    cols = (TextColumn("pricing logit shifts"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn())
    with Progress(*cols, disable=as_json, transient=True) as progress:
        task = progress.add_task("shifts", total=None)
        policy, scores = train_policy(data, heldout=heldout,
                                      on_step=lambda i, n: progress.update(task, completed=i, total=n))
    policy.trained_on["logs"] = ",".join(p.name for p in logs)
    policy.save(out)
    report = {"policy": str(out), **scores}
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    c = Console()
    c.print(f"wrote {out}: {scores['rounds_train']} rounds trained on, {scores['rounds_heldout']} held out")
    c.print("held-out throughput priced on the log (tokens / modelled second): "
            f"verify_all {scores['verify_all']:.1f}, prefix {scores['prefix']:.1f}, learned {scores['learned']:.1f}, "
            f"oracle (knows each acceptance) {scores['oracle']:.1f}")
    c.print(f"mean verify length: prefix {scores['mean_verified_prefix']:.2f}, "
            f"learned {scores['mean_verified_learned']:.2f}; logit shift {scores['shift']:+.2f}")
