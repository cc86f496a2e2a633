"""The simulator calibrated on live trials: one time scale per machine and model.

Each live trial carries the simulator's prediction for its configuration. The geometric mean of measured /
predicted throughput is the scale by which this machine (and engine) is faster than the simulator thinks; it is
stored (kb table `calibrations`) and later simulated studies of the same hardware scale every time by it: a
closed-loop throughput is multiplied by it, latencies divided. The spread says how far one scale explains the
trials; the ranking between configurations stays the simulator's.
"""

from __future__ import annotations

import math
from typing import Any

MIN_TRIALS = 2


def fit_scale(trials: list[Any]) -> dict[str, float] | None:
    logs = []
    for t in trials:
        m, p = t.user_attrs.get("metrics") or {}, t.user_attrs.get("predicted") or {}
        if m.get("throughput", 0) > 0 and p.get("throughput", 0) > 0:
            logs.append(math.log(m["throughput"] / p["throughput"]))
    if len(logs) < MIN_TRIALS:
        return None
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    return {"scale": math.exp(mean), "spread": math.exp(sd), "trials": float(len(logs))}


def store(db, study: str, spec, trials: list[Any]) -> dict[str, float] | None:  # noqa: ANN001 - KB, StudySpec
    """Fit and store the calibration of a finished live study (None: too few trials with a prediction)."""
    from kb.models_live import CalibrationRow

    fit = fit_scale(trials)
    if fit is None:
        return None
    p = spec.profile_model()
    with db.session() as s:
        s.add(CalibrationRow(hw_name=p.hw.name or "device", model_name=p.model.name or "model",
                             engine=spec.engine_version or spec.engine or "?", scale=fit["scale"],
                             spread=fit["spread"], trials=int(fit["trials"]), study=study))
    return fit


def lookup(db, hw_name: str | None, model_name: str | None) -> dict[str, Any] | None:  # noqa: ANN001 - KB
    """The latest calibration of this hardware, preferring one of the same model."""
    from sqlalchemy import select

    from kb.models_live import CalibrationRow

    if not hw_name:
        return None
    with db.session() as s:
        rows = s.execute(select(CalibrationRow).where(CalibrationRow.hw_name == hw_name)
                         .order_by(CalibrationRow.calibration_id.desc())).scalars().all()
        row = next((r for r in rows if r.model_name == model_name), rows[0] if rows else None)
        if row is None:
            return None
        return {"scale": row.scale, "spread": row.spread, "source": f"calibration #{row.calibration_id}: "
                f"{row.trials} live trials of {row.model_name} on {row.engine} (study {row.study}), measured / "
                f"predicted throughput x{row.scale:.3g}"}
