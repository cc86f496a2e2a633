"""The report's live-trial table: each trial's server (started, reused or reconfigured; start-up time), what it
measured against what the simulator predicted for the same configuration, or why its server failed."""

from __future__ import annotations

from typing import Any


def live_rows(trials: list[Any], again: dict[str, list[dict[str, float]]] | None = None) -> list[dict[str, str]]:
    """One row per live trial; `again`: the finalists' re-measurements (tuner/live/confirm.py)."""
    again = again or {}
    rows = []
    first: dict[str, int] = {}  # server key -> the trial that measured it
    for t in trials:
        a = t.user_attrs
        if a.get("mode") != "live":
            continue
        key = a.get("server_key")
        if key and not a.get("same_server"):
            first.setdefault(key, t.number)
        m, p = a.get("metrics") or {}, a.get("predicted") or {}

        if a.get("same_server"):
            start = f"same as trial {first.get(key, '?')}: not rerun"
        elif a.get("reconfigured"):
            start = "reconfigured, no restart"
        elif a.get("reused_server"):
            start = "reused"
        else:
            start = f"{a['startup_s']:.1f} s" if "startup_s" in a else "failed"
        if a.get("devices") and not a.get("same_server"):
            start += f" on {','.join(map(str, a['devices']))}"
        rows.append({"number": str(t.number), "start": start, "throughput": _both(m, p, "throughput", ",.1f"),
                     "tpot": _both(m, p, "tpot_p99_ms", ".2f"), "ttft": _both(m, p, "ttft_p99_ms", ".0f"),
                     "tau": format(m["tau"], ".2f") if "tau" in m else "-",
                     "again": ", ".join(format(x.get("throughput", 0.0), ",.1f") + ("" if x.get("meets_slo") else
                                                                                      " (SLO missed)")
                                        for x in again.get(str(t.number), [])) or "-",
                     "outcome": f"{a['fail_kind']}: {a.get('why', '')}"[:300].replace("|", "/") if a.get("fail_kind")
                     else ("meets the SLOs" if all(v <= 0 for v in t.constraints.values()) else "misses an SLO")})
    return rows


def _both(m: dict[str, float], p: dict[str, float], key: str, fmt: str) -> str:
    """The measured figure, and the predicted one in brackets."""
    got = format(m[key], fmt) if key in m else "-"
    return f"{got} ({format(p[key], fmt)})" if key in p else got


def calibration_line(trials: list[Any]) -> str | None:
    """How far the simulator's throughput was from the measurement (the calibration `tune` stores)."""
    from tuner.live.calibration import fit_scale

    fit = fit_scale(trials)
    if fit is None:
        return None
    return (f"Simulator against these measurements: measured / predicted throughput x{fit['scale']:.3g} (geometric "
            f"mean over {fit['trials']:.0f} trials, spread x{fit['spread']:.2f}). `tune` refits the simulator on them "
            "and stores the calibration; later studies of this hardware simulate with it (--no-calibration: not).")


def most_at_once(trials: list[Any]) -> int:
    """The most finished trials whose runs overlapped (each trial's start counted against every other's span)."""
    spans = [(t.datetime_start, t.datetime_complete) for t in trials if t.datetime_start and t.datetime_complete]
    return max((sum(1 for s, e in spans if s <= start < e) for start, _ in spans), default=0)


def parallel_line(trials: list[Any], isolation: dict[str, Any] | None = None) -> str | None:
    """How many live trials ran at once (`--devices`: one server per device group), and what `--isolate` measured
    neighbours to cost; None when they ran one at a time and nothing was isolated."""
    from tuner.live.isolate import isolation_text

    most = most_at_once([t for t in trials if t.user_attrs.get("mode") == "live" and not t.user_attrs.get(
        "same_server")])
    groups = {tuple(t.user_attrs["devices"]) for t in trials if t.user_attrs.get("devices")}
    iso = f" {isolation_text(isolation)}." if isolation else ""
    if most < 2:
        return iso.strip() or None
    return (f"Up to {most} trials ran side by side, each server on its own device group "
            f"({', '.join(','.join(map(str, g)) for g in sorted(groups))});" +
            (iso or " `tune --isolate` measures what neighbours cost a measurement."))
