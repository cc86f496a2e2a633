"""The file both learned policies ship: a standardised logistic model of P(a drafted position survives | its prefix
survived), a logit shift on top, and what it was trained and scored on. The verify-length policy (learned.py) and the
block-length policy (gamma_policy.py) subclass it with their feature names and their own fields."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dspark_core.atomic import atomic_write_text
from dspark_core.errors import DSparkError


def sigmoid(z: float) -> float:
    """Logistic function, clamped so that no logit overflows."""
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


class AcceptanceModel(BaseModel):
    """Acceptance logit = w . ((phi - mean) / scale) + shift over the subclass's FEATURE_NAMES."""

    model_config = ConfigDict(extra="forbid")
    FEATURE_NAMES: ClassVar[tuple[str, ...]] = ()  # phi, in order; a file from another feature set is refused
    LABEL: ClassVar[str] = "learned policy"  # how errors name the file
    TRAIN_COMMAND: ClassVar[str] = ""  # the command that writes it

    features: list[str]  # must equal FEATURE_NAMES
    mean: list[float]  # per feature: subtracted before the dot product
    scale: list[float]  # per feature: divided by (> 0)
    weights: list[float]  # acceptance logit = w . ((phi - mean) / scale) + shift
    shift: float = 0.0  # logit shift chosen by the priced throughput on the training rounds
    trained_on: dict[str, float | int | str] = {}  # rounds, throughputs of the policies compared, data source

    @model_validator(mode="after")
    def _check_model(self) -> Self:
        if self.features != list(self.FEATURE_NAMES):
            raise ValueError(f"features {self.features} differ from this engine's {list(self.FEATURE_NAMES)}; retrain "
                             f"the policy with `{self.TRAIN_COMMAND}`")
        n = len(self.FEATURE_NAMES)
        for name in ("mean", "scale", "weights"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} features")
        if any(not (s > 0.0 and math.isfinite(s)) for s in self.scale):
            raise ValueError(f"scale must be finite and > 0, got {self.scale}")
        if any(not math.isfinite(v) for v in [*self.mean, *self.weights, self.shift]):
            raise ValueError("mean, weights and shift must be finite")
        return self

    @classmethod
    def load(cls, path: str | Path) -> Self:
        p = Path(path)
        try:
            return cls.model_validate_json(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DSparkError(f"{cls.LABEL} {p} not found; train one with `python cli.py {cls.TRAIN_COMMAND}`") \
                from None
        except (ValidationError, ValueError) as e:
            first = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
            raise DSparkError(f"{cls.LABEL} {p} is invalid: {first}") from None

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, self.model_dump_json(indent=2) + "\n")

    def uses(self, name: str) -> bool:
        """Whether feature `name` moves the estimate (a feature trained with `--drop` has weight 0: nothing need
        compute it)."""
        return name in self.features and self.weights[self.features.index(name)] != 0.0

    def raw_logit(self, phi: Sequence[float]) -> float:
        """w . ((phi - mean) / scale), without the shift."""
        return sum(w * (x - m) / s for w, x, m, s in zip(self.weights, phi, self.mean, self.scale, strict=True))

    def acceptance(self, phi: Sequence[float]) -> float:
        """Estimated P(position survives | prefix survived) for one feature row."""
        return sigmoid(self.raw_logit(phi) + self.shift)
