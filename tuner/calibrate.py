"""Fit the performance model's efficiencies and overhead to measured forward times on this device.

`fit_efficiency` takes (tokens, context, requests, seconds) samples of real target forwards and
finds eff_compute, eff_memory (log grids) and the fixed overhead (least squares, >= 0) that minimise
the mean relative error of the modelled step time; the per-layer launch term is folded into the
overhead because one model's layer count is fixed during calibration.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.perf import Efficiency, Hardware, ModelShape, PerfModel

Sample = tuple[int, float, int, float]  # (new tokens, context, requests, measured seconds)


def _rel_err(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas))


def fit_efficiency(samples: Sequence[Sample], shape: ModelShape, hw: Hardware, weights_dtype: str = "fp32",
                   kv_dtype: str = "fp32") -> tuple[Efficiency, float]:
    """The best-fitting Efficiency and its mean relative error over `samples`."""
    if len(samples) < 3:
        raise ValueError("calibration needs at least 3 timed forwards")
    meas = np.array([s[3] for s in samples])
    zero = Efficiency(compute=1.0, memory=1.0, overhead_s=0.0, per_layer_s=0.0)
    base = PerfModel(shape, hw, zero, weights_dtype=weights_dtype, kv_dtype=kv_dtype)
    # the roofline terms at efficiency 1: t = max(tc / eff_c, tm / eff_m) + overhead
    tc, tm = [], []
    for tokens, ctx, reqs, _ in samples:
        cost = base.step(tokens, ctx, reqs)
        peak = hw.peak_flops[_peak_key(weights_dtype)]
        tc.append(cost.flops / peak)
        tm.append(cost.bytes / hw.bandwidth)
    tc_a, tm_a = np.array(tc), np.array(tm)
    best: tuple[float, float, float, float] | None = None
    for ec in np.geomspace(0.02, 1.0, 40):
        for em in np.geomspace(0.05, 1.5, 40):
            roof = np.maximum(tc_a / ec, tm_a / em)
            over = max(0.0, float(np.median(meas - roof)))
            err = _rel_err(roof + over, meas)
            if best is None or err < best[0]:
                best = (err, float(ec), float(em), over)
    assert best is not None
    err, ec, em, over = best
    eff = Efficiency(compute=ec, memory=em, overhead_s=over, per_layer_s=0.0,
                     source=f"calibrated on {hw.name or 'this device'} from {len(samples)} timed forwards "
                            f"(mean error {err:.1%})")
    return eff, err


def _peak_key(weights_dtype: str) -> str:
    from tuner.perf import COMPUTE_PEAK

    return COMPUTE_PEAK.get(weights_dtype, "bf16")

