"""STS on synthetic rounds whose miscalibration is known: it must find it and lower the ECE."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dspark_core.errors import DSparkError
from dspark_core.verification.calibrate import (
    StsCalibration,
    calibration_from_fit,
    expected_calibration_error,
    fit_sts,
    survival_labels,
    temperature_grid,
)


def _rounds(n: int, gamma: int, scale: list[float], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds with true conditional acceptance q_k; the head reports logit(q_k) * scale_k (scale > 1:
    overconfident). Returns raw head logits [n, gamma] and observed prefix survival [n, gamma]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(n, gamma, generator=g) * 0.9 + 0.05  # true c_k
    raw = torch.logit(q) * torch.tensor(scale)
    accept = torch.rand(n, gamma, generator=g) < q
    accepted = torch.cumprod(accept.long(), dim=1).sum(dim=1)  # draft tokens accepted per round
    return raw, survival_labels(accepted, gamma)


def test_grid_is_41_log_spaced_values_from_0_1_to_10() -> None:
    grid = temperature_grid()
    assert len(grid) == 41 and grid[0] == pytest.approx(0.1) and grid[-1] == pytest.approx(10.0)
    ratios = [b / a for a, b in zip(grid, grid[1:], strict=False)]
    assert max(ratios) == pytest.approx(min(ratios))
    assert any(abs(t - 1.0) < 1e-9 for t in grid)


def test_ece_hand_computed() -> None:
    probs = torch.tensor([0.05, 0.05, 0.95, 0.95])
    labels = torch.tensor([0.0, 0.0, 1.0, 0.0])
    # bin 0: mean p 0.05, mean y 0 -> 0.05 * 2/4; bin 14: mean p 0.95, mean y 0.5 -> 0.45 * 2/4
    assert expected_calibration_error(probs, labels) == pytest.approx(0.25)
    assert math.isnan(expected_calibration_error(torch.tensor([]), torch.tensor([])))


def test_survival_labels() -> None:
    assert survival_labels(torch.tensor([0, 2, 3]), 3).tolist() == [[0, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_sts_recovers_known_overconfidence_and_lowers_ece() -> None:
    scale = [3.0, 2.0, 0.5, 1.0]  # over-, over-, under-, well-calibrated
    raw, labels = _rounds(20_000, 4, scale, seed=0)
    fit = fit_sts(raw, labels)
    for t, s in zip(fit.temperatures, scale, strict=True):
        assert t == pytest.approx(s, rel=0.3)
    for k in range(3):
        assert fit.ece_after[k] < 0.5 * fit.ece_before[k]
    assert all(a <= b + 1e-3 for a, b in zip(fit.ece_after, fit.ece_before, strict=True))
    # held-out rounds from the same process: the fitted temperatures still lower the ECE
    raw2, labels2 = _rounds(20_000, 4, scale, seed=1)
    cal = calibration_from_fit(fit, dataset="synthetic", num_samples=20_000)
    held_raw = torch.cumprod(torch.sigmoid(raw2), dim=1)
    held_cal = torch.cumprod(cal.apply(raw2), dim=1)
    for k in range(3):
        assert expected_calibration_error(held_cal[:, k], labels2[:, k]) < \
            0.5 * expected_calibration_error(held_raw[:, k], labels2[:, k])


def test_sts_leaves_a_calibrated_head_alone_and_preserves_order() -> None:
    raw, labels = _rounds(20_000, 3, [1.0, 1.0, 1.0], seed=2)
    fit = fit_sts(raw, labels)
    assert all(t == pytest.approx(1.0, rel=0.25) for t in fit.temperatures)
    cal = StsCalibration(temperatures=[2.0, 0.5, 1.0])
    x = torch.linspace(-4, 4, 9).unsqueeze(1).repeat(1, 3)
    out = cal.apply(x)
    assert torch.all(out[1:] > out[:-1])  # order preserving per position


def test_invalid_positions_are_left_out() -> None:
    raw, labels = _rounds(5_000, 3, [3.0, 3.0, 3.0], seed=3)
    valid = torch.ones_like(labels, dtype=torch.bool)
    valid[:, 2] = False  # nobody verified position 3
    fit = fit_sts(raw, labels, valid=valid)
    cal = calibration_from_fit(fit, dataset="x", num_samples=5_000)
    assert cal.temperatures[2] == 1.0 and cal.ece_after[2] == 0.0
    with pytest.raises(ValueError):
        fit_sts(raw[:, :2], labels)
    with pytest.raises(ValueError):
        fit_sts(raw[:0], labels[:0])


def test_json_is_sglang_dspark_sts_calibration(tmp_path) -> None:
    raw, labels = _rounds(2_000, 3, [2.0, 2.0, 2.0], seed=4)
    cal = calibration_from_fit(fit_sts(raw, labels), dataset="held-out", num_samples=2_000)
    path = tmp_path / "sts.json"
    cal.save(path)
    data = json.loads(path.read_text())
    assert set(data) == {"temperatures", "dataset", "num_samples", "ece_before", "ece_after"}
    assert len(data["temperatures"]) == 3 and all(t > 0 for t in data["temperatures"])
    assert StsCalibration.load(path) == cal


def test_bad_calibration_files_are_one_line_errors(tmp_path) -> None:
    p = tmp_path / "sts.json"
    with pytest.raises(DSparkError, match="not found"):
        StsCalibration.load(p)
    p.write_text('{"temperatures": [1.0, -2.0]}')
    with pytest.raises(DSparkError, match="invalid"):
        StsCalibration.load(p)
    p.write_text('{"temperatures": [1.0], "ece_before": [0.1, 0.2]}')
    with pytest.raises(DSparkError, match="invalid"):
        StsCalibration.load(p)
    with pytest.raises(ValueError):
        StsCalibration.identity(2).apply(torch.zeros(1, 3))
