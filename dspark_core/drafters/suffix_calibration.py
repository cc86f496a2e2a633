"""Suffix decoding's frequency ratios mapped to measured acceptance (issue 42: one scale for the hybrid).

A suffix tree's ratio kid.count / node.cont is an estimate of P(next token) from a handful of occurrences: 1/1 and
50/50 are both 1.0, and neither is what the target does. The hybrid drafter compares suffix's expected accepted
length with DSpark's, whose confidences are STS-calibrated on measured rounds, so suffix's must be calibrated too.
A logistic model over each drafted token's ratio, its support (node.cont), the match length, the position and the
tree it came from gives P(token k is accepted | the tokens before it were), fitted on offline greedy rounds
(training/suffix_fit.py, `python cli.py calibrate-suffix`). The tree matters: a draft from the frozen corpus after a
one-token match has a large support, which from the request's own text means copied text and from the corpus means
a common phrase (a corpus draft has its own intercept and its own slope on the match length). The file keeps the
fitted weights beside the rows' provenance and the error on rows it was not fitted on.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dspark_core.errors import DSparkError

FILE = "suffix_calibration.json"  # shipped beside a target's committed assets
FEATURES = ("bias", "logit_ratio", "log_support", "log_match", "position", "global", "corpus",
            "corpus_log_match")  # one value each per drafted token
OWN, GLOBAL, CORPUS = 0, 1, 2  # the tree a draft came from: the request's own, recent finished outputs, the corpus
TREES = ("request", "global", "corpus")  # their names in bench JSON and /metrics, in that order
MAX_BYTES = 1 << 20  # a calibration file is a few KB


def features(ratio: float, support: int, match: int, k: int, source: int = OWN) -> list[float]:
    """The model's inputs for drafted token k (0-based) of a draft from tree `source` that followed a `match`-token
    suffix."""
    r = min(max(ratio, 1e-3), 1 - 1e-3)
    corpus = 1.0 if source == CORPUS else 0.0
    lm = math.log1p(match)
    return [1.0, math.log(r / (1 - r)), math.log1p(support), lm, float(k), 1.0 if source == GLOBAL else 0.0, corpus,
            corpus * lm]


class SuffixCalibration(BaseModel):
    """Weights of the logistic model, and what they were fitted on and how well they hold elsewhere."""

    model_config = ConfigDict(extra="forbid")

    features: list[str] = Field(min_length=1, max_length=64)  # FEATURES, in order (load_calibration checks)
    weights: list[float] = Field(min_length=1, max_length=64)  # one per feature
    fitted_on: dict[str, Any] = Field(default_factory=dict)  # the rows: target, prompts, drafter settings, counts
    heldout: dict[str, Any] = Field(default_factory=dict)  # errors on rows not fitted on (raw ratio vs calibrated)

    @model_validator(mode="after")
    def _one_weight_a_feature(self) -> SuffixCalibration:
        if len(self.weights) != len(self.features):
            raise ValueError(f"{len(self.weights)} weights for {len(self.features)} features")
        return self

    def prob(self, ratio: float, support: int, match: int, k: int, source: int = OWN) -> float:
        """P(accepted | the tokens before were) of one drafted token."""
        z = sum(w * x for w, x in zip(self.weights, features(ratio, support, match, k, source), strict=True))
        return 1.0 / (1.0 + math.exp(-max(min(z, 40.0), -40.0)))

    def probs(self, ratios: list[float], supports: list[int], match: int, source: int = OWN) -> list[float]:
        """Calibrated probabilities of a whole draft: `prob` of each token, the same sums in the same order, with
        the match's and the tree's terms taken once (every request's draft from every tree goes through here, every
        round)."""
        wb, wr, ws, wm, wk, wg, wc, wcm = self.weights
        lm = math.log1p(match)
        g = 1.0 if source == GLOBAL else 0.0
        c = 1.0 if source == CORPUS else 0.0
        out = []
        for k, (r, s) in enumerate(zip(ratios, supports, strict=True)):
            r = min(max(r, 1e-3), 1 - 1e-3)
            z = (wb * 1.0 + wr * math.log(r / (1 - r)) + ws * math.log1p(s) + wm * lm + wk * float(k) + wg * g
                 + wc * c + wcm * (c * lm))
            out.append(1.0 / (1.0 + math.exp(-max(min(z, 40.0), -40.0))))
        return out

    def save(self, path: Path) -> None:
        from dspark_core.atomic import atomic_write_text

        atomic_write_text(path, self.model_dump_json(indent=2) + "\n")


def load_calibration(path: Path) -> SuffixCalibration:
    """Read and check a calibration file; any problem is one DSparkError line naming the file."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise DSparkError(f"{path}: {path.stat().st_size} bytes is too large for a suffix calibration "
                              f"(at most {MAX_BYTES}); is it the right file?")
        cal = SuffixCalibration.model_validate_json(path.read_bytes())
    except OSError as e:
        raise DSparkError(f"{path}: cannot read the suffix calibration ({e.strerror}); check drafter.suffix_calibration"
                          ) from None
    except ValueError as e:  # pydantic's ValidationError
        first = str(e).splitlines()[1:3]
        raise DSparkError(f"{path}: not a suffix calibration ({' '.join(s.strip() for s in first)}); rerun "
                          "`python cli.py calibrate-suffix`") from None
    if tuple(cal.features) != FEATURES:
        raise DSparkError(f"{path}: features {cal.features} are not this version's {list(FEATURES)}; rerun "
                          "`python cli.py calibrate-suffix`")
    if not all(math.isfinite(w) for w in cal.weights):
        raise DSparkError(f"{path}: a weight is not finite; rerun `python cli.py calibrate-suffix`")
    return cal
