"""PNG plots for the report: optimisation history, Pareto front, importances, SPS curve, acceptance."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def history(trials: list[Any], label: str, path: Path, feasible: set[int] | None = None,
            exported: int | None = None, maximize: bool = True) -> None:
    """First objective per trial (`label` carries its unit); best-so-far over the SLO-feasible trials only, those
    that miss an SLO or do not run drawn as grey crosses, the exported trial as a star."""
    plt = _plt()
    ok = feasible if feasible is not None else {t.number for t in trials}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    good = [t for t in trials if t.number in ok]
    bad = [t for t in trials if t.number not in ok]
    ax.scatter([t.number for t in good], [t.values[0] for t in good], s=12, label="meets the SLOs")
    if bad:
        ax.scatter([t.number for t in bad], [t.values[0] for t in bad], s=14, marker="x", color="0.6",
                   label="misses an SLO / does not run")
    xs, best, run = [], [], None
    for t in sorted(good, key=lambda t: t.number):
        y = t.values[0]
        run = y if run is None else (max(run, y) if maximize else min(run, y))
        xs.append(t.number)
        best.append(run)
    if xs:
        ax.step(xs, best, where="post", color="C1", label="best feasible so far")
    _mark_exported(ax, [t for t in trials if t.number == exported], lambda t: (t.number, t.values[0]))
    ax.set_xlabel("trial")
    ax.set_ylabel(label)
    ax.set_title("Optimisation history")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mark_exported(ax: Any, trials: list[Any], xy: Any) -> None:
    for t in trials:
        x, y = xy(t)
        ax.scatter([x], [y], s=140, marker="*", color="gold", edgecolor="black", zorder=5,
                   label=f"exported (trial {t.number})")


def pareto(trials: list[Any], front: set[int], labels: list[str], path: Path, feasible: set[int] | None = None,
           exported: int | None = None) -> None:
    """Trials on the first two objectives (axis labels carry units): the Pareto front in red, trials that miss
    an SLO or do not run as grey crosses, the exported trial as a star."""
    plt = _plt()
    ok = feasible if feasible is not None else {t.number for t in trials}
    fig, ax = plt.subplots(figsize=(6, 4))
    groups = (("Pareto front", lambda t: t.number in front and t.number in ok, dict(s=24, color="C3")),
              ("meets the SLOs", lambda t: t.number not in front and t.number in ok, dict(s=10, color="C0", alpha=.5)),
              ("misses an SLO / does not run", lambda t: t.number not in ok and t.number not in front,
               dict(s=14, color="0.6", marker="x")))
    for name, keep, style in groups:
        sel = [t for t in trials if keep(t)]
        if sel:
            ax.scatter([t.values[0] for t in sel], [t.values[1] for t in sel], label=name, **style)
    _mark_exported(ax, [t for t in trials if t.number == exported], lambda t: (t.values[0], t.values[1]))
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title("Trials and Pareto front")
    ax.legend(fontsize=8)
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


def acceptance(curves: dict[str, list[float]], source: str, path: Path,
               reference: dict[str, list[float]] | None = None) -> None:
    """Per-position acceptance: `curves` solid (what the bundle's figures rest on), `reference` dashed."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=name)
    for name, ys in (reference or {}).items():
        ax.plot(range(1, len(ys) + 1), ys, linestyle="--", alpha=.6, label=name)
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(accept k | accepted k-1)")
    ax.set_title(f"Acceptance by position ({source[:60]})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speedup(curves: dict[str, list[tuple[int, float, int]]], hw: str, path: Path) -> None:
    """Predicted speedup over no speculation against concurrency, one line per method; each point is labelled
    with the draft length the batch-size schedule gives it there (K = 0: speculation off, 1.0x)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (method, pts) in enumerate(curves.items()):
        xs, ys = [c for c, _, _ in pts], [s for _, s, _ in pts]
        ax.plot(xs, ys, marker="o", color=f"C{i}", label=method)
        for c, s, k in pts:
            ax.annotate(f"K{k}", (c, s), textcoords="offset points", xytext=(3, 3), fontsize=6, color=f"C{i}")
    ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (closed-loop clients)")
    ax.set_ylabel("predicted speedup over no speculation")
    ax.set_title(f"Speedup by method on {hw} (simulated)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cluster_fronts(fronts: dict[str, list[Any]], chosen: Any, tuned: Any, path: Path) -> None:
    """Tokens/s per GPU against tokens/s per user: each serving mode's Pareto front (tuner/cluster.py Layouts),
    the chosen layout as planned (speculation off), and the same layout with its decoding server as tuned."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, front in sorted(fronts.items()):
        marker = "o" if mode == "agg" else "s"
        if front:
            pts = sorted(front, key=lambda p: p.tokens_per_s_user)
            ax.plot([p.tokens_per_s_user for p in pts], [p.tokens_per_s_gpu for p in pts], marker=marker, ms=4,
                    label="aggregated" if mode == "agg" else "disaggregated (prefill / decode)")
    ax.scatter([chosen.tokens_per_s_user], [chosen.tokens_per_s_gpu], s=90, marker="D", facecolor="none",
               edgecolor="black", zorder=5, label="chosen, speculation off")
    ax.scatter([tuned.tokens_per_s_user], [tuned.tokens_per_s_gpu], s=140, marker="*", color="gold",
               edgecolor="black", zorder=6, label="chosen, its decoding server as tuned")
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Deployment layouts meeting the SLOs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
