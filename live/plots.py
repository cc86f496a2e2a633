"""`monitor report`: one PNG of a watched deployment over time (tau, acceptance by position, latency, load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kb.deployments import Sample, window


def report_png(info: dict[str, Any], samples: list[Sample], path: Path) -> dict[str, Any]:
    """Draw the four panels into `path`; returns the whole-watch window it summarises."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pred = info.get("predictions") or {}
    wins = [window(a, b) for a, b in zip(samples, samples[1:], strict=False)]
    t = [b.t - samples[0].t for b in samples[1:]]
    whole = window(samples[0], samples[-1])
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    a = ax[0][0]
    a.plot(t, [w.get("tau") for w in wins], marker=".", label="observed (per interval)")
    if pred.get("tau"):
        a.axhline(pred["tau"], color="C1", ls="--", label="predicted")
    a.set(title="tau (accepted tokens per round, incl. the bonus)", xlabel="s")
    a.legend(fontsize=8)
    a = ax[0][1]
    obs = whole.get("position_acceptance") or []
    a.plot(range(1, len(obs) + 1), obs, marker="o", label="observed (whole watch)")
    if pred.get("position_acceptance"):
        p = pred["position_acceptance"]
        a.plot(range(1, len(p) + 1), p, marker="x", ls="--", label="predicted")
    a.set(title="acceptance by draft position", xlabel="position", ylim=(0, 1.05))
    a.legend(fontsize=8)
    a = ax[1][0]
    for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "TPOT p50"),
                       ("itl_p99_ms", "TPOT p99")):
        a.plot(t, [w.get(key) for w in wins], marker=".", label=label)
    for key, label in (("ttft_p99_ms", "TTFT p99 predicted"), ("tpot_p99_ms", "TPOT p99 predicted")):
        if pred.get(key):
            a.axhline(pred[key], ls=":", color="0.4", lw=1)
            a.annotate(label, (0, pred[key]), fontsize=7, color="0.4")
    a.set(title="latency (server side)", xlabel="s", ylabel="ms", yscale="log")
    a.legend(fontsize=8)
    a = ax[1][1]
    a.plot(t, [w["output_tokens_per_s"] for w in wins], color="C0", label="output tok/s")
    a.set(title="load", xlabel="s", ylabel="tokens/s")
    b = a.twinx()
    b.plot(t, [w["running"] for w in wins], color="C2", label="running")
    b.plot(t, [w["waiting"] for w in wins], color="C3", label="waiting")
    b.set_ylabel("requests")
    a.legend(loc="upper left", fontsize=8)
    b.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"deployment {info['deployment_id']}: {info['url']} ({info['kind']}), {len(samples)} samples")
    fig.tight_layout()
    from dspark_core.atomic import atomic_write

    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return whole
