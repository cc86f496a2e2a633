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
                   kv_dtype: str = "fp32", unbiased: bool = False) -> tuple[Efficiency, float]:
    """The best-fitting Efficiency and its mean relative error over `samples`.

    `unbiased`: afterwards scale all modelled times so their sum equals the measured sum. The
    relative-error fit tracks the typical forward; on a shared, busy CPU the occasional preempted
    forward makes the mean (what throughput sees) slower than the typical one.
    """
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
    if unbiased:
        pred = np.maximum(tc_a / ec, tm_a / em) + over
        k = float(meas.sum() / pred.sum())
        ec, em, over = ec / k, em / k, over * k
        err = _rel_err(np.maximum(tc_a / ec, tm_a / em) + over, meas)
    eff = Efficiency(compute=ec, memory=em, overhead_s=over, per_layer_s=0.0,
                     source=f"calibrated on {hw.name or 'this device'} from {len(samples)} timed forwards "
                            f"(mean error {err:.1%})")
    return eff, err


def _peak_key(weights_dtype: str) -> str:
    from tuner.perf import COMPUTE_PEAK

    return COMPUTE_PEAK.get(weights_dtype, "bf16")



# -- calibration of the whole engine on this device (simulator fidelity) -----------------------------------

class _TimedTarget:
    """Delegates to the target model and logs every forward as a (tokens, context, requests, seconds) sample."""

    def __init__(self, model, log: list[Sample]) -> None:
        self._model, self._log = model, log

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __call__(self, tokens, cache, slots, n_new=None, **kw):
        import time

        b, t = tokens.shape  # [B, T] rows padded past n_new: token-wise work runs on the real tokens only
        ctx = float(cache.lens[slots].float().max()) + t / 2  # attention stays padded to the longest row
        t0 = time.perf_counter()
        out = self._model(tokens, cache, slots, n_new, **kw)
        self._log.append((sum(n_new) if n_new is not None else b * t, ctx, b, time.perf_counter() - t0))
        return out


def instrumented_generate(engine, prompts, sampling) -> dict:
    """Run `engine.generate` while timing every target forward and every drafter call.

    Returns the Generation plus: `forwards` (target samples), `drafts` (drafting rows, block, mean
    context, seconds of propose + the following update), `confidences` (per proposal [rows, g] lists
    of the scheduler's confidences, for the acceptance model's Beta spread).
    """
    import time

    forwards: list[Sample] = []
    drafts: list[list[float]] = []
    confs: list[list[list[float]]] = []
    real = engine.target
    engine.target = _TimedTarget(real, forwards)
    d = engine.drafter
    if d is not None:
        propose, update = d.propose, d.update

        def timed_propose(reqs):
            t0 = time.perf_counter()
            prop = propose(reqs)
            rows = [r for r in reqs if r.gamma > 0]
            ctx = float(np.mean([len(r.tokens) for r in rows])) if rows else 0.0
            drafts.append([len(rows), max((r.gamma for r in reqs), default=0), ctx, time.perf_counter() - t0])
            if prop.confidence is not None:
                confs.append([[float(c) for c in prop.confidence[i, :n]] for i, n in enumerate(prop.num) if n])
            return prop

        def timed_update(results):
            t0 = time.perf_counter()
            update(results)
            if drafts:
                drafts[-1][3] += time.perf_counter() - t0

        d.propose, d.update = timed_propose, timed_update
    try:
        gen = engine.generate(prompts, sampling)
    finally:
        engine.target = real
        if d is not None:
            del d.propose, d.update
    return {"generation": gen, "forwards": forwards, "drafts": drafts, "confidences": confs}


def beta_concentration(conf_rows: list[list[list[float]]], first: float = 0.0) -> float:
    """Method-of-moments kappa of confidences ~ Beta(kappa a, kappa (1 - a)), median over draft positions."""
    by_pos: dict[int, list[float]] = {}
    for rows in conf_rows:
        for row in rows:
            for k, c in enumerate(row):
                by_pos.setdefault(k, []).append(min(0.999, max(0.001, c)))
    ks = []
    for vals in by_pos.values():
        if len(vals) < 8:
            continue
        m, v = float(np.mean(vals)), float(np.var(vals))
        if v > 1e-6:
            ks.append(m * (1 - m) / v - 1)
    return float(np.clip(np.median(ks), 0.5, 200.0)) if ks else 3.0


def fit_round_overhead(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares, both >= 0: residual seconds ~ round_s * rounds + round_request_s * request rounds.

    rows: (residual seconds = measured - modelled without round overhead, rounds, request rounds).
    """
    a = np.array([[r[1], r[2]] for r in rows], dtype=float)
    y = np.array([r[0] for r in rows], dtype=float)
    w = 1.0 / np.maximum(1e-9, np.abs(y) + a.sum(1) * 1e-4)  # relative weighting: short runs count as much
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    if coef[0] >= 0 and coef[1] >= 0:
        return float(coef[0]), float(coef[1])
    best = (1e18, 0.0, 0.0)
    for j in (0, 1):  # one term alone
        x = a[:, j] * w
        c = max(0.0, float(x @ (y * w) / max(1e-18, x @ x)))
        err = float(np.sum((a[:, j] * c - y) ** 2 * w**2))
        if err < best[0]:
            best = (err, c if j == 0 else 0.0, c if j == 1 else 0.0)
    return best[1], best[2]
