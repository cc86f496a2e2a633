"""Watch a server's /metrics: scrape on an interval, store each sample, compare with the bundle's predictions.

Predictions come from the bundle's provenance.json: the tuned trial's tau, p99 TPOT and TTFT, and the
per-position acceptance the tuner assumed (`predicted_acceptance`). A figure drifts when it is off by more than
the tolerance (relative; acceptance by the mean absolute difference over positions)."""

from __future__ import annotations

import http.client
import math
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb.deployments import Sample
from live.scrape import parse
from live.urls import server_url
from profiler.errors import ProfileError

MAX_PAGE_BYTES = 32 << 20  # of one /metrics page (a busy vLLM page is well under 1 MiB)
MAX_PROVENANCE_BYTES = 16 << 20  # of a bundle's provenance.json


def metrics_url(url: str) -> str:
    """The /metrics address of a server given as its base, its /v1 or its /metrics URL."""
    u = url.rstrip("/")
    server_url(u)  # one line for a bad address ('not a url', a bad port), before any connection
    if u.endswith("/metrics"):
        return u
    u = u.removesuffix("/v1")
    return (u if "://" in u else "http://" + u) + "/metrics"


def scrape(url: str, timeout_s: float = 10.0) -> Sample:
    """One /metrics page as a Sample; an unreachable server, a page over MAX_PAGE_BYTES or a page that is not
    Prometheus text is one ProfileError line (what `watch` skips after its first scrape)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            data = r.read(MAX_PAGE_BYTES + 1)
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError; InvalidURL a ValueError
        raise ProfileError(f"cannot scrape {url} ({getattr(e, 'reason', e)}); is the server up and does it "
                           "export Prometheus metrics?") from None
    if len(data) > MAX_PAGE_BYTES:
        raise ProfileError(f"{url}: the metrics page is over {MAX_PAGE_BYTES >> 20} MiB; is this a Prometheus "
                           "/metrics page?")
    try:
        return parse(data.decode(errors="replace"), time.time())
    except ValueError as e:
        raise ProfileError(f"{url} is not a Prometheus metrics page ({str(e)[:200]})") from None


def predictions(bundle: Path) -> dict[str, Any]:
    """What the bundle's tuning predicted (provenance.json, read bounded); one line when the folder is not a bundle.
    A figure that is not a finite number (NaN, Infinity, text) is left out: there is nothing to compare it with,
    and PostgreSQL's JSON, where the predictions are stored, refuses NaN."""
    from dspark_core.errors import DSparkError
    from dspark_core.jsonl import parse_line
    from dspark_core.userfiles import read_capped

    prov = bundle / "provenance.json"
    try:
        data = parse_line(read_capped(prov, MAX_PROVENANCE_BYTES, "a provenance.json"), prov, None, allow_nan=True)
    except DSparkError as e:
        raise ProfileError(f"--bundle {bundle}: no readable provenance.json ({e}); point it at the folder "
                           "`tune` exported") from None
    if not isinstance(data, dict):
        raise ProfileError(f"--bundle {bundle}: provenance.json is not a JSON object; point it at the folder "
                           "`tune` exported")
    m, acc, params = (_obj(data.get(k)) for k in ("metrics", "predicted_acceptance", "params"))
    out = {"tau": _num(m.get("tau")), "tpot_p99_ms": _num(m.get("tpot_p99_ms")),
           "ttft_p99_ms": _num(m.get("ttft_p99_ms")), "throughput_per_gpu": _num(m.get("throughput")),
           "tp": _num(params.get("parallel.tp", 1)), "position_acceptance": _nums(acc.get("position_acceptance")),
           "head": _str(acc.get("head") or params.get("spec.head")),
           "gamma": _num(acc.get("gamma") or params.get("spec.block_size")), "study": _str(data.get("study")),
           "cost_source": _str(data.get("cost_source"))}
    return {k: v for k, v in out.items() if v is not None}


def _obj(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _num(x: Any) -> float | int | None:
    """A finite number (one a float can hold), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return x if math.isfinite(float(x)) else None
    except OverflowError:  # an integer past 1e308
        return None


def _nums(x: Any) -> list[float] | None:
    """A non-empty list of finite numbers, else None."""
    return x if isinstance(x, list) and x and all(_num(v) is not None for v in x) else None


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


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
          on_sample: Callable[[Sample], None], first_done: bool = False) -> int:
    """Scrape every `interval_s` until `samples` scrapes or `duration_s` seconds (Ctrl-C or SIGTERM stops it
    too, between samples: a sample is stored whole or not at all); returns the number of scrapes. A scrape that
    fails after the first is skipped, not fatal: the server may restart (`first_done`: the caller has scraped
    once already, so every failure is skipped)."""
    stop = threading.Event()
    previous = _on_stop_signals(stop)
    start, n = time.monotonic(), 0
    try:
        while (samples is None or n < samples) and not stop.is_set():
            t = time.monotonic()
            try:
                on_sample(scrape(url))
                n += 1
            except ProfileError:
                if n == 0 and not first_done:
                    raise
            if samples is not None and n >= samples:
                return n
            if duration_s is not None and time.monotonic() - start + interval_s > duration_s:
                return n
            stop.wait(max(0.0, interval_s - (time.monotonic() - t)))  # a stop wakes it at once
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return n


def _on_stop_signals(stop: threading.Event) -> dict[int, Any]:
    """Route SIGINT and SIGTERM to `stop` while watching (main thread only: Python delivers signals there);
    returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous
