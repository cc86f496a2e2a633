"""Verification-length schedulers: how many drafted tokens each request sends to the target this round.

Every scheduler takes the per-request, per-position *conditional* confidences c[r][k] (k = 0..n_r-1,
already STS-calibrated, each in [0, 1]; n_r = drafted tokens available to request r, 0 for a request
in fallback) and returns l_r in 0..n_r: the number of draft tokens request r verifies. The target
forward then runs over l_r + 1 tokens for that request (the anchor position yields the bonus token).
Inputs are plain lists or a [R, gamma] tensor, so the engine and the tuner's simulator share the code.

Schedulers (DESIGN.md section 4):
- `verify_all`: l_r = n_r.
- `threshold`: the longest prefix whose survival a_{r,j} = prod_{i<=j} c_{r,i} stays >= a threshold.
- `prefix`: the hardware-aware prefix scheduler, Algorithm 1 of the DSpark paper, with the early stop.
  Without the stop (`early_stop=False`, for tests only) the admission of token j can depend on
  confidences computed from token j itself, which biases the output distribution (paper, Appendix A).
- `async_topk`: the production variant: the capacity K comes from an unconstrained search over the
  confidences of two rounds ago; this round admits the global top-K candidates by survival.

Losslessness: candidates are ranked by the key (-a_{r,j}, r, j). Since a_{r,j+1} <= a_{r,j}, every
candidate that depends on draft token x_{r,j} (positions > j of request r) ranks after (r, j), so the
admission of (r, j) never sees x_{r,j}: the non-anticipating property of lossless speculative decoding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dspark_core.verification.sps import SpsTable

SCHEDULERS = ("verify_all", "threshold", "prefix", "async_topk")

Confidences = Sequence[Sequence[float]]  # c[r][k]: ragged, one row per request, values in [0, 1]


def as_rows(confidences: object, lengths: Sequence[int] | None = None) -> list[list[float]]:
    """Normalise a [R, gamma] tensor / array or a ragged list to a list of float rows.

    `lengths[r]` (optional) truncates row r to the tokens actually drafted for that request.
    """
    rows = confidences.tolist() if hasattr(confidences, "tolist") else confidences  # type: ignore[union-attr]
    out = [[min(1.0, max(0.0, float(c))) for c in row] for row in rows]  # type: ignore[union-attr]
    if lengths is not None:
        if len(lengths) != len(out):
            raise ValueError(f"{len(lengths)} lengths for {len(out)} requests")
        out = [row[: max(0, int(n))] for row, n in zip(out, lengths, strict=True)]
    return out


def prefix_survival(rows: Confidences) -> list[list[float]]:
    """a[r][j] = prod_{i<=j} c[r][i]: the probability that draft tokens 1..j+1 of request r all survive."""
    out: list[list[float]] = []
    for row in rows:
        acc, surv = 1.0, []
        for c in row:
            acc *= c
            surv.append(acc)
        out.append(surv)
    return out


def ranked_candidates(survival: Sequence[Sequence[float]]) -> list[tuple[float, int, int]]:
    """All (a, r, j) with a > 0, in admission order: a descending, then request, then position."""
    cands = [(a, r, j) for r, row in enumerate(survival) for j, a in enumerate(row) if a > 0.0]
    cands.sort(key=lambda t: (-t[0], t[1], t[2]))
    return cands


def verify_all(rows: Confidences) -> list[int]:
    """Verify every drafted token."""
    return [len(row) for row in rows]


def threshold_lengths(rows: Confidences, threshold: float) -> list[int]:
    """Longest prefix with survival >= threshold (a is non-increasing, so this is a prefix)."""
    out = []
    for surv in prefix_survival(rows):
        n = 0
        while n < len(surv) and surv[n] >= threshold:
            n += 1
        out.append(n)
    return out


@dataclass(frozen=True)
class PrefixDecision:
    """What Algorithm 1 decided, with the numbers behind it (for logs, tests and the simulator)."""

    lengths: list[int]  # l_r: draft tokens verified per request
    batch_tokens: int  # B = sum_r (1 + l_r)
    expected_tokens: float  # tau* = sum_r (1 + sum_{j<=l_r} a_{r,j})
    throughput: float  # Theta = tau* * SPS(B), expected tokens per second


def prefix_schedule(rows: Confidences, sps: SpsTable, *, early_stop: bool = True,
                    overhead_s: float = 0.0) -> PrefixDecision:
    """Hardware-aware prefix scheduler (DSpark Algorithm 1).

    Start with every request verifying only its anchor (B = R, tau* = R, Theta_best = R * SPS(R)), then
    admit candidates in ranked order: B += 1, tau* += a, Theta = tau* * SPS(B); keep the admission if
    Theta > Theta_best, else stop. With `early_stop=False` the walk continues past a non-improving step
    and returns the best prefix of the ranking (the retrospective search; not lossless, tests only).
    Batches above `sps.max_batch_tokens` are never built.

    Engine adaptation: `overhead_s` adds a fixed per-round cost (drafting, bookkeeping) to the target
    step, Theta = tau* / (1 / SPS(B) + overhead_s). Batches are priced ragged (B = sum_r (l_r + 1)),
    as SGLang and our engine verify them.
    """
    survival = prefix_survival(rows)
    n_req = len(survival)
    if n_req == 0:
        return PrefixDecision([], 0, 0.0, 0.0)
    def rate(b: int) -> float:
        return 1.0 / (1.0 / sps.lookup(b) + overhead_s)

    flat = n_req  # sum_r (1 + l_r)
    tau = float(n_req)
    best = tau * rate(n_req)
    best_tau, best_batch = tau, n_req
    cur = [0] * n_req
    chosen = [0] * n_req
    for a, r, j in ranked_candidates(survival):
        batch = flat + 1
        if batch > sps.max_batch_tokens:
            break
        cur[r] = j + 1
        flat = batch
        tau += a
        theta = tau * rate(batch)
        if theta > best:
            best, best_tau, best_batch = theta, tau, batch
            chosen = list(cur)
        elif early_stop:
            break
    return PrefixDecision(chosen, best_batch, best_tau, best)


def padded_schedule(rows: Confidences, sps: SpsTable, sizes: Sequence[int], *, overhead_s: float = 0.0,
                    batch_rows: int | None = None, step_s: Mapping[int, float] | None = None) -> PrefixDecision:
    """Algorithm 1 for a compiled step, whose batch is dense: every row runs T tokens, T the smallest step size
    holding the longest verify (modeling/compiled.py), and the row count is padded to `batch_rows`. The cost of a
    round is then set by one number, the tokens per row, so the choice is over the step sizes: for each size T,
    every request verifies min(T - 1, its drafts) tokens (the padding computes them anyway), tau* = sum_r (1 +
    survival of those tokens), Theta = tau* / (1 / SPS(rows x T) + overhead_s); the best T wins (T = 1: a plain
    step). `step_s`: the measured seconds of the target step at a batch's token count, where the engine has run it
    (EngineScheduler.step_s); it replaces the probe's 1 / SPS for that count. Lengths depend on the confidences
    only, as Algorithm 1's do."""
    survival = prefix_survival(rows)
    n_req = len(survival)
    if n_req == 0:
        return PrefixDecision([], 0, 0.0, 0.0)
    padded = max(batch_rows or n_req, n_req)
    longest = max((len(r) for r in survival), default=0)
    best: PrefixDecision | None = None
    for t in sorted({1, *sizes}):
        if t - 1 > longest and best is not None:
            break  # nothing more to verify: a larger step only costs more
        tokens = padded * t
        if tokens > sps.max_batch_tokens and best is not None:
            break
        lengths = [min(t - 1, len(r)) for r in survival]
        tau = sum(1.0 + sum(r[:n]) for r, n in zip(survival, lengths, strict=True))
        seconds = step_s.get(tokens) if step_s else None
        theta = tau / ((seconds or 1.0 / sps.lookup(tokens)) + overhead_s)
        if best is None or theta > best.throughput:
            best = PrefixDecision(lengths, tokens, tau, theta)
    assert best is not None
    return best


def topk_lengths(rows: Confidences, k: int) -> list[int]:
    """Admit the k highest-survival candidates globally (ranked as above; always a per-request prefix)."""
    survival = prefix_survival(rows)
    out = [0] * len(survival)
    for _, r, j in ranked_candidates(survival)[: max(0, k)]:
        out[r] = max(out[r], j + 1)
    return out


class Scheduler(Protocol):
    """What the engine and the simulator call once per round."""

    name: str

    def schedule(self, rows: Confidences) -> list[int]: ...

    def reset(self) -> None: ...


@dataclass
class VerifyAllScheduler:
    """Fixed-length verification: every drafted token goes to the target."""

    name: str = "verify_all"

    def schedule(self, rows: Confidences) -> list[int]:
        return verify_all(rows)

    def reset(self) -> None:
        return None


@dataclass
class ThresholdScheduler:
    """Static threshold on calibrated prefix survival (the single-request heuristic of prior work)."""

    threshold: float = 0.5  # verify while prod_{i<=j} c_i >= this
    name: str = "threshold"

    def schedule(self, rows: Confidences) -> list[int]:
        return threshold_lengths(rows, self.threshold)

    def reset(self) -> None:
        return None


@dataclass
class PrefixScheduler:
    """Algorithm 1 with the early stop: lossless, load-aware."""

    sps: SpsTable  # profiled cost table
    name: str = "prefix"
    overhead_s: float = 0.0  # fixed cost per round on top of the target step (seconds)
    last: PrefixDecision | None = None  # the latest decision, for stats

    def schedule(self, rows: Confidences) -> list[int]:
        self.last = prefix_schedule(rows, self.sps, early_stop=True, overhead_s=self.overhead_s)
        return self.last.lengths

    def reset(self) -> None:
        self.last = None


@dataclass
class AsyncTopKScheduler:
    """Production variant (paper section 5.2): capacity from lagged confidences, then global top-K.

    The capacity K (draft tokens admitted this round, all requests together) is what the unconstrained
    search (no early stop, so it can cross jagged SPS cliffs) picks on the confidences seen `lag` rounds
    ago; the current round then admits its own top-K candidates. K never depends on the current draft
    tokens, and top-K admission of (r, j) never sees x_{r,j} (see the module docstring), so the output
    distribution is exact. Until `lag` rounds of history exist, it falls back to Algorithm 1 with the
    early stop on the current confidences, which is lossless too.
    """

    sps: SpsTable  # profiled cost table
    lag: int = 2  # rounds between the confidences that size K and the round that uses K
    name: str = "async_topk"
    overhead_s: float = 0.0  # fixed cost per round on top of the target step (seconds)
    history: deque[list[list[float]]] = field(default_factory=deque)  # past confidences, oldest first
    last_capacity: int | None = None  # K used in the latest round (None = warm-up round)

    def capacity_from(self, rows: Confidences) -> int:
        """K = draft tokens admitted by the unconstrained search on `rows`."""
        return sum(prefix_schedule(rows, self.sps, early_stop=False,
                                   overhead_s=self.overhead_s).lengths)

    def schedule(self, rows: Confidences) -> list[int]:
        current = [list(r) for r in rows]
        if len(self.history) >= self.lag:
            k = self.capacity_from(self.history[-self.lag])
            k = min(k, max(0, self.sps.max_batch_tokens - len(current)))
            lengths = topk_lengths(current, k)
            self.last_capacity = k
        else:
            lengths = prefix_schedule(current, self.sps, early_stop=True,
                                      overhead_s=self.overhead_s).lengths
            self.last_capacity = None
        self.history.append(current)
        while len(self.history) > self.lag:
            self.history.popleft()
        return lengths

    def reset(self) -> None:
        self.history.clear()
        self.last_capacity = None


def make_scheduler(name: str, *, sps: SpsTable | None = None, threshold: float = 0.5,
                   lag: int = 2) -> Scheduler:
    """Build a scheduler by its parameter name (`spec.scheduler`); prefix/async_topk need an SPS table."""
    if name == "verify_all":
        return VerifyAllScheduler()
    if name == "threshold":
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"confidence threshold must be in [0, 1], got {threshold}")
        return ThresholdScheduler(threshold=threshold)
    if name in ("prefix", "async_topk"):
        if sps is None:
            raise ValueError(f"scheduler {name!r} needs an SPS table (profile the target or pass sps.json)")
        return PrefixScheduler(sps=sps) if name == "prefix" else AsyncTopKScheduler(sps=sps, lag=lag)
    raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")

