"""PNG plots for the report: optimisation history, Pareto front, importances, SPS curve, acceptance."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def history(trials: list[Any], objective: str, path: Path) -> None:
    plt = _plt()
    xs = [t.number for t in trials]
    ys = [t.values[0] for t in trials]
    best, run = [], None
    for y in ys:
        run = y if run is None else max(run, y)
        best.append(run)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(xs, ys, s=12, label="trial")
    ax.plot(xs, best, color="C1", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(objective)
    ax.set_title("Optimisation history")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pareto(trials: list[Any], front: set[int], names: list[str], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in trials:
        on = t.number in front
        ax.scatter(t.values[0], t.values[1], s=22 if on else 10, color="C3" if on else "C0", alpha=1 if on else .5)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title("Pareto front (red)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def importances(values: dict[str, float], path: Path) -> None:
    plt = _plt()
    items = sorted(values.items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(items) + 1.2))
    ax.barh([k for k, _ in items], [v for _, v in items])
    ax.set_xlabel("importance (fANOVA) for the first objective")
    ax.set_title("Parameter importances")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sps_curve(tokens: list[int], sps: list[float], kind: str, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.step(tokens, sps, where="post", color="C0")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verify batch tokens B")
    ax.set_ylabel("target steps / s (SPS)", color="C0")
    twin = ax.twinx()
    twin.plot(tokens, [b * s for b, s in zip(tokens, sps, strict=True)], "--", color="C1")
    twin.set_ylabel("verify tokens / s (B x SPS)", color="C1")
    ax.set_title(f"SPS table ({kind})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def acceptance(curves: dict[str, list[float]], source: str, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=name)
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(accept k | accepted k-1)")
    ax.set_title(f"Acceptance by position ({source[:60]})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
