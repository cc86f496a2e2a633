"""What a compiled verify step costs when its real tokens run packed, and Algorithm 1 priced by it.

A compiled step runs on a grid of b rows (a power of two) x T tokens per row (a step size). Dense, every cell runs the
GEMMs; packed (modeling/compiled.py `_core`'s `packed`, the CPU's verify steps), only the N real tokens do and
attention alone spans the grid. Measured on SmolLM2-135M bf16 (AVX512-BF16, 2 threads, context 256;
benchmarks/packed_step.py), 8 rows x 9: all 72 tokens 80 ms, 20 real tokens 45 ms; 8 x 3: 24 tokens 41 ms, 10 real 31
ms; 8 x 1: 28 ms. Between its two ends a grid's time is a line in N (the GEMMs grow with the rows, attention does
not), so each grid is probed at both: one real token a row (N = b) and every cell (N = b x T). A lone request's step
always holds T real tokens (N = 1 is never a packed step): its grid runs from the 1-token step to the full one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dspark_core.verification.schedulers import PrefixDecision, prefix_survival

if TYPE_CHECKING:
    from dspark_core.modeling.model import KVCache, LeanModel

Grid = tuple[int, int]  # (rows b, a power of two; tokens per row T, a step size)


@dataclass
class GridCosts:
    """Seconds of a packed compiled step per grid, at its fewest and most real tokens, with an online correction."""

    low: dict[Grid, float]  # one real token a row (N = b)
    full: dict[Grid, float]  # every cell (N = b x T)
    ema: float = 0.2  # weight of the newest measured step in a grid's correction
    scale: dict[Grid, float] = field(default_factory=dict)  # measured / probed, per grid (EMA)

    def _probed(self, grid: Grid, tokens: int) -> float:
        """The probes' seconds for `grid` at `tokens` real tokens: a line between its two ends."""
        b, t = grid
        lo, hi = self.low[grid], self.full[grid]
        frac = 0.0 if t == 1 else min(1.0, max(0.0, (tokens - b) / (b * t - b)))
        return lo + (hi - lo) * frac

    def seconds(self, grid: Grid, tokens: int) -> float:
        """Predicted seconds of a step on `grid` with `tokens` real tokens (the probes' line, corrected)."""
        return self._probed(grid, tokens) * self.scale.get(grid, 1.0)

    def observe(self, grid: Grid, tokens: int, seconds: float) -> None:
        """The engine ran `grid` with `tokens` real tokens in `seconds`: the probes ran at a short context on an idle
        machine, so each grid keeps the ratio of what the engine measures to what they predict."""
        if grid not in self.low:
            return
        ratio = seconds / max(self._probed(grid, tokens), 1e-9)
        old = self.scale.get(grid)
        self.scale[grid] = ratio if old is None else (1 - self.ema) * old + self.ema * ratio


def probe_grids(target: LeanModel, cache: KVCache, context: int, rows: int, sizes: Sequence[int],
                max_batch_tokens: int, repeats: int, hidden_layers: tuple[int, ...], low: bool = True) -> GridCosts:
    """Time every grid the engine can run (b a power of two <= rows, T in {1, *sizes}), full and (`low`) at one real
    token a row, interleaved in rounds over all shapes (drifting load on shared cores hits all alike); median
    seconds. The slots 0..rows-1 of `cache` hold `context` tokens each and are left so. Without `low` (a dense
    step) each grid's low end is its full time."""
    import torch

    grids = sorted({(b, t) for b in (1 << i for i in range(rows.bit_length())) for t in {1, *sizes}
                    if b <= rows and b * t <= max(max_batch_tokens, rows)})
    shapes = [(g, full) for g in grids for full in ((True, False) if low and g[0] > 1 and g[1] > 1 else (True,))]
    times: dict[tuple[Grid, bool], list[float]] = {sh: [] for sh in shapes}

    def step(grid: Grid, full: bool) -> None:
        b, t = grid
        target(torch.randint(1, target.arch.vocab_size, (b, t)), cache, list(range(b)), [t if full else 1] * b,
               hidden_layers=hidden_layers)
        for r in range(b):
            cache.truncate(r, context)
        if target.device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(max(3, repeats)):
        for sh in shapes:
            step(*sh)  # warm this shape (compiled on its first call)
            t0 = time.perf_counter()
            step(*sh)
            times[sh].append(time.perf_counter() - t0)
    full = {g: statistics.median(times[(g, True)]) for g in grids}
    # one request verifies all its T tokens (N = T >= 2): its grid's low end is the 1-token step
    ends = {g: statistics.median(times[(g, False)]) if (g, False) in times else full[(g[0], 1)] if low else full[g]
            for g in grids}
    return GridCosts(low=ends, full=full)


def packed_schedule(rows: Sequence[Sequence[float]], costs: GridCosts, sizes: Sequence[int], *,
                    overhead_s: float = 0.0, batch_rows: int | None = None) -> PrefixDecision:
    """Algorithm 1 for a packed compiled step: for each step size T (the grid), admit draft tokens (at most T - 1 a
    request) in order of their survival probability, each a prefix of its request's drafts, and keep the count with
    the best Theta = tau* / (seconds(grid, N) + overhead_s), N the real tokens (requests + admitted drafts). A request
    whose drafts are weak verifies nothing while its neighbour verifies a block, and pays only for its anchor.
    Lengths depend on the confidences only, as Algorithm 1's do (lossless under sampling with last round's)."""
    survival = prefix_survival([list(r) for r in rows])
    n_req = len(survival)
    if n_req == 0:
        return PrefixDecision([], 0, 0.0, 0.0)
    b = max(batch_rows or n_req, n_req)
    best = PrefixDecision([0] * n_req, n_req, float(n_req),
                          n_req / (costs.seconds((b, 1), n_req) + overhead_s) if (b, 1) in costs.low else 0.0)
    longest = max((len(r) for r in survival), default=0)
    for t in sorted(s for s in sizes if s > 1):
        if (b, t) not in costs.low:
            continue
        cands = sorted(((a, r, j) for r, row in enumerate(survival) for j, a in enumerate(row[: t - 1]) if a > 0.0),
                       key=lambda c: (-c[0], c[1], c[2]))
        lengths, tau = [0] * n_req, float(n_req)
        for k, (a, r, j) in enumerate(cands, start=1):
            lengths[r] = max(lengths[r], j + 1)
            tau += a
            theta = tau / (costs.seconds((b, t), n_req + k) + overhead_s)
            if theta > best.throughput:
                best = PrefixDecision(list(lengths), n_req + k, tau, theta)
        if t - 1 >= longest:
            break  # every draft fits this grid: a larger one only costs more
    return best


def survival_floor(costs: GridCosts, rows: int, sizes: Sequence[int], *, overhead_s: float = 0.0,
                   batch_rows: int | None = None, boost: float = 1.0) -> float:
    """A survival probability below which `packed_schedule` never admits a draft of a `rows`-request round: the
    drafter may stop drafting there (DSparkDraftModel._greedy), since no later draft of the row survives more.

    Admitting a token of survival a to a prefix with expected tokens tau on grid g raises Theta only if
    a x (seconds + overhead_s) > tau x (its marginal seconds), and the best prefix ends on such a token (the
    candidates are sorted by survival). tau >= rows, a grid's seconds are at most its full step's and its marginal
    seconds a token are its line's slope, so no admitted token is below rows x slope / (full + overhead_s) on any
    grid; `boost` is the most the scheduler scales a row's survival by (EngineScheduler.factor's clamp). 0.0 where
    a grid costs no more for more tokens (then nothing is ever ruled out)."""
    b = max(batch_rows or rows, rows)
    floor = float("inf")
    for t in (s for s in sizes if s > 1):
        grid = (b, t)
        if grid not in costs.low:
            continue
        lo, hi = costs.seconds(grid, b), costs.seconds(grid, b * t)
        floor = min(floor, rows * max(hi - lo, 0.0) / (b * t - b) / (hi + overhead_s))
    return 0.0 if floor == float("inf") else floor / boost
