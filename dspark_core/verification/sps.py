"""SPS table: target steps per second as a function of the verify batch size in tokens.

The hardware-aware schedulers (Algorithm 1 of the DSpark paper, and its async top-K variant) trade
expected accepted tokens against the cost of a bigger verify batch; that cost is this table. It is
profiled once when the engine starts (`profile_sps`) and saved in SGLang's `SpsCostTable` JSON
format, so a bundle written by the tuner can be handed to SGLang unchanged:

    {"sample_batch_tokens": [strictly increasing ints],
     "sample_steps_per_sec": [floats, same length],
     "max_batch_tokens": int >= last probe}

Lookup is a step function on the lower probe: SPS(B) = steps_per_sec[i] for the largest probe
i with batch_tokens[i] <= B, clamped to the first probe below it and to the last probe above it.
"""

from __future__ import annotations

import bisect
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dspark_core.atomic import atomic_write_text
from dspark_core.errors import DSparkError


class SpsTableFile(BaseModel):
    """The JSON file as SGLang reads it (`SpsCostTable`); validation happens here, at the edge."""

    model_config = ConfigDict(extra="forbid")

    sample_batch_tokens: list[int]  # verify batch sizes in tokens, strictly increasing, >= 1
    sample_steps_per_sec: list[float]  # measured target steps per second at each probe, > 0
    max_batch_tokens: int  # largest batch the engine may run; >= the last probe

    @model_validator(mode="after")
    def _check(self) -> SpsTableFile:
        tokens, sps = self.sample_batch_tokens, self.sample_steps_per_sec
        if not tokens:
            raise ValueError("sample_batch_tokens is empty; profile at least one batch size")
        if len(tokens) != len(sps):
            raise ValueError(f"sample_batch_tokens has {len(tokens)} probes but sample_steps_per_sec "
                             f"has {len(sps)}")
        if tokens[0] < 1 or any(b <= a for a, b in zip(tokens, tokens[1:], strict=False)):
            raise ValueError(f"sample_batch_tokens must be positive and strictly increasing, got {tokens}")
        if any(not (v > 0.0) for v in sps):
            raise ValueError(f"sample_steps_per_sec must all be > 0, got {sps}")
        if self.max_batch_tokens < tokens[-1]:
            raise ValueError(f"max_batch_tokens {self.max_batch_tokens} is below the last probe {tokens[-1]}")
        return self


@dataclass(frozen=True)
class SpsTable:
    """Immutable, validated SPS table with an O(log n) step-function lookup."""

    sample_batch_tokens: tuple[int, ...]  # probe batch sizes (tokens), strictly increasing
    sample_steps_per_sec: tuple[float, ...]  # target steps per second at each probe
    max_batch_tokens: int  # capacity limit: schedulers never build a bigger verify batch

    def __post_init__(self) -> None:
        try:
            SpsTableFile(sample_batch_tokens=list(self.sample_batch_tokens),
                         sample_steps_per_sec=list(self.sample_steps_per_sec),
                         max_batch_tokens=self.max_batch_tokens)
        except ValidationError as e:
            raise ValueError(_first_error(e)) from None

    def lookup(self, batch_tokens: int) -> float:
        """SPS at `batch_tokens`: the value of the largest probe <= it (first probe below the table)."""
        i = bisect.bisect_right(self.sample_batch_tokens, batch_tokens) - 1
        return self.sample_steps_per_sec[max(i, 0)]

    __call__ = lookup

    @classmethod
    def from_probes(cls, probes: Iterable[tuple[int, float]],
                    max_batch_tokens: int | None = None) -> SpsTable:
        """Build from (batch_tokens, steps_per_sec) pairs in any order; duplicates are an error."""
        pairs = sorted(probes)
        if not pairs:
            raise ValueError("no probes given")
        tokens = tuple(int(b) for b, _ in pairs)
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"duplicate probe batch sizes in {list(tokens)}")
        return cls(tokens, tuple(float(s) for _, s in pairs),
                   int(max_batch_tokens if max_batch_tokens is not None else tokens[-1]))

    @classmethod
    def flat(cls, max_batch_tokens: int) -> SpsTable:
        """The 'not profiled' table: every batch costs the same, so bigger batches always look free."""
        return cls((1,), (1.0,), max(1, int(max_batch_tokens)))

    def to_dict(self) -> dict[str, object]:
        return {"sample_batch_tokens": list(self.sample_batch_tokens),
                "sample_steps_per_sec": list(self.sample_steps_per_sec),
                "max_batch_tokens": self.max_batch_tokens}

    def save(self, path: str | Path) -> None:
        """Write SGLang's SpsCostTable JSON atomically (temp file + os.replace)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> SpsTable:
        """Read an SpsCostTable JSON; any problem is one DSparkError line naming the file."""
        p = Path(path)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DSparkError(f"SPS table {p} not found; profile one with the engine or pass an existing "
                              "path") from None
        except (OSError, json.JSONDecodeError) as e:
            raise DSparkError(f"SPS table {p} is not readable JSON ({e}); regenerate it") from None
        if isinstance(raw, dict) and "bias_seconds" in raw:
            raise DSparkError(f"SPS table {p} is SGLang's additive form; the bundled engine reads only the "
                              "sampled form (sample_batch_tokens / sample_steps_per_sec / max_batch_tokens)")
        try:
            f = SpsTableFile.model_validate(raw)
        except ValidationError as e:
            raise DSparkError(f"SPS table {p} is invalid: {_first_error(e)}") from None
        return cls(tuple(f.sample_batch_tokens), tuple(f.sample_steps_per_sec), f.max_batch_tokens)


def default_probes(max_batch_tokens: int) -> list[int]:
    """Probe sizes 1, 2, 3, 4, 6, 8, 12, 16, ... up to and including max_batch_tokens."""
    out: list[int] = []
    p = 1
    while p < max_batch_tokens:
        out.append(p)
        if p >= 2 and p * 3 // 2 < max_batch_tokens and (p * 3 // 2) not in out:
            out.append(p * 3 // 2)
        p *= 2
    out.append(max_batch_tokens)
    return sorted(set(out))


def profile_sps(step: Callable[[int], None], batch_tokens: Sequence[int], *, warmup: int = 1,
                repeats: int = 3, max_batch_tokens: int | None = None,
                clock: Callable[[], float] = time.perf_counter) -> SpsTable:
    """Time `step(B)` (one target forward over B verify tokens) at each probe; median of `repeats`.

    The engine passes a closure that runs its target model on B tokens; the tuner's simulator passes a
    modelled step. Measured speeds are made non-increasing in B (a bigger batch is never faster; jitter
    that says otherwise would make the scheduler chase noise).
    """
    probes = sorted(set(int(b) for b in batch_tokens))
    if not probes or probes[0] < 1:
        raise ValueError(f"probe batch sizes must be positive, got {list(batch_tokens)}")
    sps: list[float] = []
    for b in probes:
        for _ in range(warmup):
            step(b)
        times = []
        for _ in range(max(1, repeats)):
            t0 = clock()
            step(b)
            times.append(max(clock() - t0, 1e-9))
        sps.append(1.0 / statistics.median(times))
    for i in range(1, len(sps)):
        sps[i] = min(sps[i], sps[i - 1])
    return SpsTable.from_probes(zip(probes, sps, strict=True), max_batch_tokens or probes[-1])


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
