"""Watch a server's /metrics: scrape on an interval, store each sample, compare with the bundle's predictions.

Predictions come from the bundle's provenance.json: the tuned trial's tau, p99 TPOT and TTFT, and the
per-position acceptance the tuner assumed (`predicted_acceptance`). A figure drifts when it is off by more than
the tolerance (relative; acceptance by the mean absolute difference over positions)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb.deployments import Sample
from live.scrape import parse
from profiler.errors import ProfileError


def metrics_url(url: str) -> str:
    """The /metrics address of a server given as its base, its /v1 or its /metrics URL."""
    u = url.rstrip("/")
    if u.endswith("/metrics"):
        return u
    u = u.removesuffix("/v1")
    return (u if "://" in u else "http://" + u) + "/metrics"


def scrape(url: str, timeout_s: float = 10.0) -> Sample:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text = r.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        raise ProfileError(f"cannot scrape {url} ({getattr(e, 'reason', e)}); is the server up and does it "
                           "export Prometheus metrics?") from None
    try:
        return parse(text, time.time())
    except ValueError as e:
        raise ProfileError(f"{url} is not a Prometheus metrics page ({e})") from None


def predictions(bundle: Path) -> dict[str, Any]:
    """What the bundle's tuning predicted (provenance.json); one line when the folder is not a bundle."""
    prov = bundle / "provenance.json"
    try:
        data = json.loads(prov.read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"--bundle {bundle}: no readable provenance.json ({e}); point it at the folder "
                           "`tune` exported") from None
    m, acc = data.get("metrics") or {}, data.get("predicted_acceptance") or {}
    params = data.get("params") or {}
    out = {"tau": m.get("tau"), "tpot_p99_ms": m.get("tpot_p99_ms"), "ttft_p99_ms": m.get("ttft_p99_ms"),
           "throughput_per_gpu": m.get("throughput"), "tp": params.get("parallel.tp", 1),
           "position_acceptance": acc.get("position_acceptance"), "head": acc.get("head") or params.get("spec.head"),
           "gamma": acc.get("gamma") or params.get("spec.block_size"), "study": data.get("study"),
           "cost_source": data.get("cost_source")}
    return {k: v for k, v in out.items() if v is not None}


@dataclass
class Check:
    """One compared figure."""

    metric: str
    observed: float | list[float] | None
    predicted: float | list[float] | None
    drift: bool | None  # None: nothing to compare


def compare(win: dict[str, Any], pred: dict[str, Any], tolerance: float) -> list[Check]:
    """Observed (a window) against predicted, per figure."""
    def rel(metric: str, obs: float | None, key: str) -> Check:
        p = pred.get(key)
        drift = None if obs is None or not p else abs(obs - p) / p > tolerance
        return Check(metric, obs, p, drift)

    out = [rel("tau", win.get("tau"), "tau"),
           rel("p99 TPOT ms", win.get("itl_p99_ms"), "tpot_p99_ms"),
           rel("p99 TTFT ms", win.get("ttft_p99_ms"), "ttft_p99_ms")]
    obs, p = win.get("position_acceptance"), pred.get("position_acceptance")
    drift = None
    if obs and p:
        n = min(len(obs), len(p))
        drift = sum(abs(a - b) for a, b in zip(obs[:n], p[:n], strict=True)) / n > tolerance * (sum(p[:n]) / n)
    out.append(Check("acceptance by position", obs, p, drift))
    return out


def watch(url: str, interval_s: float, samples: int | None, duration_s: float | None,
          on_sample: Callable[[Sample], None], sleep: Callable[[float], None] = time.sleep) -> int:
    """Scrape every `interval_s` until `samples` scrapes or `duration_s` seconds (Ctrl-C stops it too); returns
    the number of scrapes. A scrape that fails after the first is skipped, not fatal: the server may restart."""
    start, n = time.monotonic(), 0
    try:
        while True:
            t = time.monotonic()
            try:
                on_sample(scrape(url))
                n += 1
            except ProfileError:
                if n == 0:
                    raise
            if samples is not None and n >= samples:
                return n
            if duration_s is not None and time.monotonic() - start + interval_s > duration_s:
                return n
            sleep(max(0.0, interval_s - (time.monotonic() - t)))
    except KeyboardInterrupt:
        return n
