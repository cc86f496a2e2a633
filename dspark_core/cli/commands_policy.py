"""CLI commands `train-policy` and `train-gamma-policy`: the learned verification length and block length from round
logs (dspark_core/training/train_policy.py, train_gamma.py; the policies are in dspark_core/verification/learned.py,
gamma_policy.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from dspark_core.verification.acceptance_model import AcceptanceModel


def register(app: typer.Typer) -> None:
    app.command("train-policy")(train_policy_cmd)
    app.command("train-gamma-policy")(train_gamma_cmd)


def _fit(fit: Callable[[Callable[[int, int], None]], tuple[AcceptanceModel, dict[str, float]]], logs: list[Path],
         out: Path, as_json: bool) -> tuple[AcceptanceModel, dict[str, float]] | None:
    """Run a trainer under a progress bar over its logit shifts, write its policy to `out` and, with --json, print
    the report (then None: nothing left to print)."""
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    cols = (TextColumn("pricing logit shifts"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn())
    with Progress(*cols, disable=as_json, transient=True) as progress:
        task = progress.add_task("shifts", total=None)
        policy, scores = fit(lambda i, n: progress.update(task, completed=i, total=n))
    policy.trained_on["logs"] = ",".join(p.name for p in logs)
    policy.save(out)
    if as_json:
        sys.stdout.write(json.dumps({"policy": str(out), **scores}, indent=2) + "\n")
        return None
    return policy, scores


def train_policy_cmd(
    logs: Annotated[list[Path], typer.Argument(help="Round logs (JSONL written with spec.round_log, ideally under "
                                               "spec.scheduler=verify_all: full information).")],
    out: Annotated[Path, typer.Option(help="Policy JSON to write (spec.policy_path).")] = Path("policy.json"),
    heldout: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of each log's last rounds kept out of "
                                           "training to compare the policies on.")] = 0.2,
    drop: Annotated[list[str] | None, typer.Option(help="Leave a feature out (repeatable): confidence_logit, "
                                                   "entropy, position or recent_acceptance. Without entropy the "
                                                   "engine skips computing it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Train `spec.scheduler: learned` from logged rounds; compare it with verify_all and prefix on held-out ones."""
    from rich.console import Console

    from dspark_core.training.train_policy import check_drop, load_rounds, train_policy

    check_drop(drop or ())
    data = load_rounds(logs)
    done = _fit(lambda step: train_policy(data, heldout=heldout, on_step=step, drop=drop or ()), logs, out, as_json)
    if done is None:
        return
    _, scores = done
    c = Console()
    c.print(f"wrote {out}: {scores['rounds_train']} rounds trained on, {scores['rounds_heldout']} held out")
    c.print("held-out throughput priced on the log (tokens / modelled second): "
            f"verify_all {scores['verify_all']:.1f}, prefix {scores['prefix']:.1f}, learned {scores['learned']:.1f}, "
            f"oracle (knows each acceptance) {scores['oracle']:.1f}")
    c.print(f"mean verify length: prefix {scores['mean_verified_prefix']:.2f}, "
            f"learned {scores['mean_verified_learned']:.2f}; logit shift {scores['shift']:+.2f}")


def train_gamma_cmd(
    logs: Annotated[list[Path], typer.Argument(help="Round logs (spec.round_log) of the deployment's traffic, best "
                                               "written with spec.gamma_policy=explore under spec.scheduler=verify_all "
                                               "(every block length and plain steps, interleaved).")],
    out: Annotated[Path, typer.Option(help="Policy JSON to write (spec.gamma_policy_path).")] = Path("gamma.json"),
    heldout: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of each log's last rounds kept out of "
                                           "training to compare the policies on.")] = 0.2,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Train `spec.gamma_policy: learned` from logged rounds; compare it with every static block on held-out ones."""
    from rich.console import Console

    from dspark_core.training.train_gamma import load_gamma_rounds, train_gamma_policy
    from dspark_core.verification.gamma_policy import GammaPolicyFile

    rounds = load_gamma_rounds(logs, heldout)
    done = _fit(lambda step: train_gamma_policy(rounds, on_step=step), logs, out, as_json)
    if done is None:
        return
    policy, scores = done
    assert isinstance(policy, GammaPolicyFile)
    c = Console()
    g = policy.gamma_max
    c.print(f"wrote {out}: {scores['rounds_train']} rounds trained on, {scores['rounds_heldout']} held out")
    c.print("held-out throughput priced on the logs (tokens / modelled second): "
            + ", ".join(f"block {k} {scores[f'static_{k}']:.1f}" for k in range(g + 1))
            + f"; learned {scores['learned']:.1f} (mean block {scores['mean_block_learned']:.2f}, plain "
            f"{scores['plain_share_learned']:.0%} of rounds); per-round oracle {scores['oracle']:.1f}")
    cost = dict(zip(policy.cost_terms, [round(v, 5) for v in policy.cost], strict=True))
    c.print(f"round seconds beyond the SPS step, per term: {cost}; "
            f"logit shift {policy.shift:+.2f}")
