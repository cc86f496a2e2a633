"""Sequential Temperature Scaling (STS) of the confidence head (DSpark paper, section 3.2.1).

The hardware-aware scheduler needs *absolute* prefix-survival probabilities a_k = prod_{i<=k} c_i, not
just a ranking, and neural confidence heads are overconfident. STS fits one temperature per draft
position on held-out rounds, left to right: for k = 1..gamma, with T_1..T_{k-1} fixed, pick T_k from a
grid of 41 log-spaced values in [0.1, 10] minimising the 15-bin ECE of
prod_{i<=k} sigmoid(logit_i / T_i) against the observed prefix survival (1 if draft tokens 1..k were all
accepted). Temperature scaling is order preserving, so the head's ranking is untouched.

The result is written in SGLang's `DSparkStsCalibration` JSON format:
{"temperatures": [gamma floats > 0], "dataset": str, "num_samples": int,
 "ece_before": [gamma floats], "ece_after": [gamma floats]}.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from dspark_core.atomic import atomic_write_text
from dspark_core.errors import DSparkError

NUM_BINS = 15  # ECE bins (equal width on [0, 1])
GRID_SIZE = 41  # temperatures in the grid
GRID_MIN, GRID_MAX = 0.1, 10.0  # grid range (log-spaced)


class StsCalibration(BaseModel):
    """SGLang's DSparkStsCalibration: one temperature per draft position, with the ECE it achieved."""

    model_config = ConfigDict(extra="forbid")

    temperatures: list[float]  # T_k, k = 1..gamma; position k uses sigmoid(raw_k / T_k)
    dataset: str = ""  # what the held-out rounds came from
    num_samples: int = 0  # held-out rounds used for the fit
    ece_before: list[float] = []  # per-position ECE of the raw cumulative product
    ece_after: list[float] = []  # per-position ECE after STS

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("temperatures is empty; need one per draft position")
        if any(not (t > 0.0 and math.isfinite(t)) for t in v):
            raise ValueError(f"temperatures must all be finite and > 0, got {v}")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> StsCalibration:
        for name in ("ece_before", "ece_after"):
            got = getattr(self, name)
            if got and len(got) != len(self.temperatures):
                raise ValueError(f"{name} has {len(got)} entries for {len(self.temperatures)} temperatures")
        return self

    @property
    def gamma(self) -> int:
        return len(self.temperatures)

    @classmethod
    def identity(cls, gamma: int) -> StsCalibration:
        """No calibration: every temperature 1."""
        return cls(temperatures=[1.0] * gamma)

    def apply(self, raw: torch.Tensor) -> torch.Tensor:
        """Calibrated conditional confidences sigmoid(raw_k / T_k); raw: [..., k<=gamma] -> same shape."""
        k = raw.shape[-1]
        if k > self.gamma:
            raise ValueError(f"calibration covers {self.gamma} positions, got {k}")
        temps = torch.tensor(self.temperatures[:k], dtype=raw.dtype, device=raw.device)
        return torch.sigmoid(raw / temps)

    def save(self, path: str | Path) -> None:
        """Write the JSON atomically (temp file + os.replace)."""
        atomic_write_text(path, json.dumps(self.model_dump(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> StsCalibration:
        """Read an STS JSON; any problem is one DSparkError line naming the file."""
        p = Path(path)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DSparkError(f"STS calibration {p} not found; run `calibrate` or pass an existing "
                              "path") from None
        except (OSError, json.JSONDecodeError) as e:
            raise DSparkError(f"STS calibration {p} is not readable JSON ({e}); rerun `calibrate`") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err.get("loc", ()))
            raise DSparkError(f"STS calibration {p} is invalid: {loc}: {err.get('msg')}") from None


def temperature_grid(size: int = GRID_SIZE, lo: float = GRID_MIN, hi: float = GRID_MAX) -> list[float]:
    """`size` log-spaced temperatures from lo to hi inclusive (1.0 is on the default grid)."""
    if size == 1:
        return [lo]
    step = (math.log10(hi) - math.log10(lo)) / (size - 1)
    return [10 ** (math.log10(lo) + i * step) for i in range(size)]


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, num_bins: int = NUM_BINS) -> float:
    """Equal-width-bin ECE: sum_b |mean(p in b) - mean(label in b)| * n_b / n (empty input -> nan)."""
    p = probs.reshape(-1).to(torch.float64).clamp(0.0, 1.0)
    y = labels.reshape(-1).to(torch.float64)
    if p.numel() == 0:
        return float("nan")
    idx = (p * num_bins).long().clamp(0, num_bins - 1)  # [n]
    p_sum = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, p)
    y_sum = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, y)
    return float((p_sum - y_sum).abs().sum() / p.numel())  # |mean p - mean y| * n_b / n, summed


def survival_labels(accepted: torch.Tensor, gamma: int) -> torch.Tensor:
    """Observed prefix survival: label[n, k] = 1 if the first k+1 draft tokens of round n were accepted.

    accepted: [N] number of draft tokens accepted per round (bonus token excluded) -> [N, gamma] float.
    """
    pos = torch.arange(gamma).unsqueeze(0)  # [1, gamma]
    return (pos < accepted.reshape(-1, 1)).to(torch.float64)


@dataclass(frozen=True)
class StsFit:
    """Result of `fit_sts` before it is wrapped for the JSON file."""

    temperatures: list[float]  # T_k per position
    ece_before: list[float]  # ECE of prod sigmoid(raw) per position
    ece_after: list[float]  # ECE of prod sigmoid(raw / T) per position


def fit_sts(raw: torch.Tensor, labels: torch.Tensor, *, grid: list[float] | None = None,
            num_bins: int = NUM_BINS, valid: torch.Tensor | None = None) -> StsFit:
    """Fit STS temperatures left to right.

    raw: [N, gamma] confidence-head logits; labels: [N, gamma] observed prefix survival (0/1, non-increasing
    along k); valid: optional [N, gamma] bool, False where the round did not verify position k (those
    entries are left out of that position's ECE). Ties keep the temperature closest to 1 (no change when
    nothing is gained).
    """
    if raw.dim() != 2 or raw.shape != labels.shape:
        raise ValueError(f"raw and labels must both be [N, gamma], got {tuple(raw.shape)} and "
                         f"{tuple(labels.shape)}")
    if raw.shape[0] == 0:
        raise ValueError("no held-out rounds to calibrate on")
    grid = grid if grid is not None else temperature_grid()
    order = sorted(grid, key=lambda t: abs(math.log(t)))  # prefer T near 1 on ties
    raw64, y = raw.to(torch.float64), labels.to(torch.float64)
    mask = valid.to(torch.bool) if valid is not None else torch.ones_like(y, dtype=torch.bool)
    n, gamma = raw64.shape
    surv_raw = torch.ones(n, dtype=torch.float64)
    surv_fit = torch.ones(n, dtype=torch.float64)
    temps: list[float] = []
    before: list[float] = []
    after: list[float] = []
    for k in range(gamma):
        m = mask[:, k]
        surv_raw = surv_raw * torch.sigmoid(raw64[:, k])
        before.append(expected_calibration_error(surv_raw[m], y[m, k], num_bins))
        best_t, best_e, best_s = 1.0, math.inf, surv_fit
        for t in order:
            cand = surv_fit * torch.sigmoid(raw64[:, k] / t)
            e = expected_calibration_error(cand[m], y[m, k], num_bins)
            if e < best_e - 1e-12:
                best_t, best_e, best_s = t, e, cand
        temps.append(float(best_t))
        after.append(float(best_e) if math.isfinite(best_e) else float("nan"))
        surv_fit = best_s
    return StsFit(temps, before, after)


def calibration_from_fit(fit: StsFit, *, dataset: str, num_samples: int) -> StsCalibration:
    """Wrap a fit in the JSON model (positions with no data get T = 1 and ECE 0)."""
    def clean(xs: list[float]) -> list[float]:
        return [0.0 if math.isnan(x) else x for x in xs]
    return StsCalibration(temperatures=fit.temperatures, dataset=dataset, num_samples=num_samples,
                          ece_before=clean(fit.ece_before), ece_after=clean(fit.ece_after))
