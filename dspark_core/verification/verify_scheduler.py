"""Engine side of the schedulers: the `VerifyScheduler` the round loop calls (drafters/base.py).

It ties together, per round: the gamma regulator and fallback (how many tokens each request drafts,
regulator.py), a verification-length policy (schedulers.py) fed with the drafter's calibrated
confidences, and the SPS table (sps.py) that the prefix / async_topk policies need: loaded from
`spec.sps_path` when given, else profiled on the target when the engine starts.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_core.drafters.suffix_tree import expected_accepted
from dspark_core.errors import DSparkError
from dspark_core.verification.gamma_policy import (
    NO_CLASSES,
    GammaPolicyFile,
    TokenClasses,
    choose_blocks,
    text_features,
)
from dspark_core.verification.grid_costs import GridCosts, packed_schedule, probe_grids, survival_floor
from dspark_core.verification.learned import LearnedScheduler, PolicyFile, RollingAcceptance, RoundContext
from dspark_core.verification.regulator import GammaRegulator, RegulatorConfig
from dspark_core.verification.round_log import RoundLog, RoundRecord
from dspark_core.verification.schedulers import Scheduler, make_scheduler
from dspark_core.verification.sps import SpsTable, default_probes, profile_sps

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig
    from dspark_core.drafters.base import DraftRequest, Proposal, RoundResult
    from dspark_core.modeling.model import KVCache, LeanModel


@dataclass
class EngineScheduler:
    """VerifyScheduler over a policy from schedulers.py plus the regulator."""

    policy: Scheduler  # verify_all | threshold | prefix | async_topk | learned
    regulator: GammaRegulator  # per-request block length and plain-decoding fallback
    max_verify: int = 16  # spec.max_verify_tokens
    name: str = ""  # scheduler name in stats (defaults to the policy's)
    learn_overhead: bool = True  # estimate the per-round cost beyond the target step online
    ema: float = 0.2  # weight of the newest round in the overhead estimate
    log: RoundLog | None = None  # spec.round_log: every round's features and outcome, for train-policy
    waiting: int = 0  # requests queued behind the running ones (the engine sets it before each round)
    gamma_policy: GammaPolicyFile | None = None  # spec.gamma_policy learned: picks each round's block
    sps: SpsTable | None = None  # the table the gamma policy prices rounds with
    classes: TokenClasses = NO_CLASSES  # token classes of the text features (the engine sets them from its tokenizer)
    explore: random.Random | None = None  # spec.gamma_policy explore: a uniform block in 0..block_size per round
    dense_sizes: tuple[int, ...] = ()  # a compiled target's step sizes (dense rows x T): prefix / async_topk choose T
    _prev_rows: list[list[float]] | None = field(default=None, repr=False)  # last round's confidences (dense, sampled)
    _round_start: float | None = field(default=None, repr=False)  # first gamma() call of the current round
    _batch: int | None = field(default=None, repr=False)  # verify tokens chosen this round
    _seen: dict | None = field(default=None, repr=False)  # what choose() saw, for the round log
    acceptance: RollingAcceptance = field(default_factory=RollingAcceptance)  # per slot, for the learned policies
    _planned: dict[int, int] = field(default_factory=dict, repr=False)  # slot -> this round's learned block
    step_s: dict[int, float] = field(default_factory=dict)  # dense: measured step seconds per batch tokens (EMA)
    grid: GridCosts | None = None  # packed compiled verify steps: seconds per grid and real tokens (grid_costs.py)
    _pred_s: float | None = field(default=None, repr=False)  # packed: the chosen round's predicted step seconds
    calibration: dict[str, list[float]] = field(default_factory=dict)  # proposer -> [accepted, expected], decayed
    _expect: dict[int, tuple[str, float]] = field(default_factory=dict, repr=False)  # slot -> (proposer, expected)

    def __post_init__(self) -> None:
        self.name = self.name or self.policy.name

    def _observe_round_time(self, now: float) -> None:
        """A round runs from its first gamma() call to observe(): target step at the chosen batch + everything
        else (drafting, verification, bookkeeping). The 'everything else' part becomes the policy's per-round
        overhead (EMA); the step is its measured time where the engine has run the shape (`step_took`), else the
        probe's. Prefills between rounds fall outside this span: they cost per request, not per round."""
        sps = getattr(self.policy, "sps", None)
        start, batch = self._round_start, self._batch
        self._round_start, self._batch = None, None
        if start is None or batch is None or sps is None or not self.learn_overhead:
            return
        pred, self._pred_s = self._pred_s, None
        extra = max(0.0, (now - start) - (pred or self.step_s.get(batch) or 1.0 / sps.lookup(batch)))
        old = float(getattr(self.policy, "overhead_s", 0.0))
        self.policy.overhead_s = extra if old == 0.0 else (1 - self.ema) * old + self.ema * extra  # type: ignore[attr-defined]

    @property
    def reads_entropy(self) -> bool:
        """Whether anything reads the drafter's per-position entropies: the round log, or a learned verify-length
        policy that weighs them (one trained with `--drop entropy` does not)."""
        learned = isinstance(self.policy, LearnedScheduler) and self.policy.policy.uses("entropy")
        return self.log is not None or learned

    def _features(self) -> bool:
        """Whether anything reads the per-round features (entropies, rolling acceptance): learned policy, log."""
        return self.log is not None or isinstance(self.policy, LearnedScheduler) or self.gamma_policy is not None

    @property
    def plans_blocks(self) -> bool:
        """Whether `round_block` picks the blocks (spec.gamma_policy learned or explore); else the engine skips it."""
        return self.explore is not None or (self.gamma_policy is not None and self.sps is not None)

    def round_block(self, running: list[tuple[int, list[int], int]], block: int) -> int:
        """This round's block for (slot, committed tokens, tokens it may still draft) per request: the learned
        gamma policy's pick in 0..block, and per request whether it drafts (`gamma` then answers it); `block`
        itself without a policy."""
        self._planned = {}
        if self.explore is not None and running:
            self._round_start = time.perf_counter()
            g = self.explore.randint(0, block)
            self._planned = {slot: min(g, cap) for slot, _, cap in running}
            return g
        if self.gamma_policy is None or self.sps is None or not running:
            return block
        self._round_start = time.perf_counter()
        g = min(block, self.gamma_policy.gamma_max)
        survival = [self.gamma_policy.survival(self.acceptance.get(slot), text_features(toks, self.classes), g)
                    for slot, toks, _ in running]
        caps = [max(0, min(cap, self.regulator.gamma_for(slot))) for slot, _, cap in running]
        plan = choose_blocks(self.gamma_policy, self.sps, survival, caps, g, sum(len(t) for _, t, _ in running))
        self._planned = {slot: n for (slot, _, _), n in zip(running, plan, strict=True)}
        return max(plan)

    def gamma(self, slot: int, default: int) -> int:
        if self._round_start is None:
            self._round_start = time.perf_counter()
        return min(default, self.regulator.gamma_for(slot), self._planned.get(slot, default))

    def choose(self, requests: list[DraftRequest], proposal: Proposal) -> list[int]:
        nums = [min(n, self.max_verify) for n in proposal.num]
        if proposal.confidence is None:  # a drafter without a confidence head: nothing to rank
            return nums
        conf = proposal.confidence.detach().float().cpu().tolist()
        rows = [row[:n] for row, n in zip(conf, nums, strict=True)]
        if self._features():
            ent = proposal.entropy.tolist() if proposal.entropy is not None else [[] for _ in rows]
            ent = [row[:n] for row, n in zip(ent, nums, strict=True)]
            recent = [self.acceptance.get(r.slot) for r in requests]
            if isinstance(self.policy, LearnedScheduler):
                self.policy.context = RoundContext(recent_acceptance=recent, entropy=ent)
        ranked = self.policy.name in ("prefix", "async_topk")
        source = proposal.source or [""] * len(rows)
        used = [self._scaled(row, src) for row, src in zip(rows, source, strict=True)] if ranked else rows
        if self.dense_sizes and ranked:
            lengths, self._batch = self._dense(requests, used)
        else:
            lengths = self.policy.schedule(used)
            self._batch = sum(lengths) + len(rows)  # ragged verify batch in tokens
        if ranked:
            self._expect = {r.slot: (src, expected_accepted(row[:n]))
                            for r, row, src, n in zip(requests, rows, source, lengths, strict=True) if n}
        if self.log is not None:
            self._seen = dict(running=len(rows), waiting=self.waiting, confidence=rows, entropy=ent,
                              recent_acceptance=recent, verified=list(lengths), batch_tokens=self._batch,
                              drafted=list(proposal.num), context=[len(r.tokens) for r in requests],
                              text=[text_features(r.tokens, self.classes) for r in requests])
        return lengths

    def factor(self, source: str = "") -> float:
        """Accepted over expected drafts of `source`'s verified rows, recent rounds weighted up (CAL_DECAY a round)
        and shrunk towards 1 by CAL_PRIOR tokens, within [0.5, 2]. A proposer's calibration holds on average over
        the data it was fitted on, not on this traffic: on SmolLM2 at 8 requests suffix's expectations ran 12% high
        on chat and 12-19% low on code, and the scheduler took 3-token steps chat's drafts could not pay for."""
        accepted, expected = self.calibration.get(source, (0.0, 0.0))
        return min(CAL_MAX, max(0.5, (accepted + CAL_PRIOR) / (expected + CAL_PRIOR)))

    def _scaled(self, row: list[float], source: str) -> list[float]:
        """`row`'s confidences with every prefix-survival probability times factor(source) (the first one scaled,
        kept below 1)."""
        f = self.factor(source)
        if not row or f == 1.0:
            return row
        return [min(0.999, row[0] * f), *row[1:]]

    def _recalibrate(self, results: list[RoundResult]) -> None:
        """Fold this round's verified rows into their proposers' accepted / expected counts."""
        expect, self._expect = self._expect, {}
        if not expect:
            return
        for counts in self.calibration.values():
            counts[0] *= CAL_DECAY
            counts[1] *= CAL_DECAY
        for res in results:
            if res.slot in expect:
                src, exp = expect[res.slot]
                counts = self.calibration.setdefault(src, [0.0, 0.0])
                counts[0] += res.accepted
                counts[1] += exp

    def _dense(self, requests: list[DraftRequest], rows: list[list[float]]) -> tuple[list[int], int]:
        """Verify lengths for a compiled step (schedulers.padded_schedule): the tokens per row T, then every request
        verifies min(T - 1, its drafts). A greedy batch picks T on this round's confidences (any choice is lossless
        under greedy verification); a sampled one on the previous round's, which the current drafts cannot
        influence, so rejection sampling stays exact (async_topk's lag, one round; the first round verifies all)."""
        from dspark_core.modeling.compiled import bucket
        from dspark_core.verification.schedulers import padded_schedule

        greedy = all(r.sampling.greedy for r in requests)
        basis = rows if greedy else self._prev_rows
        self._prev_rows = rows
        padded = bucket(len(rows))
        if basis is not None and self.grid is not None:  # packed: each request its own length, priced by tokens
            dec = packed_schedule(basis, self.grid, self.dense_sizes, batch_rows=padded,
                                  overhead_s=float(getattr(self.policy, "overhead_s", 0)))
            lengths = dec.lengths if greedy else [min(max(dec.lengths, default=0), len(r)) for r in rows]
            tokens = sum(lengths) + len(rows)
            grid = (padded, self._size(max(lengths, default=0) + 1))
            self._pred_s = self.grid.seconds(grid, tokens) if grid in self.grid.low else None  # None: the SPS table
            return lengths, tokens
        if basis is None:
            t = max(len(r) for r in rows) + 1
        else:
            sps = self.policy.sps  # type: ignore[attr-defined]
            dec = padded_schedule(basis, sps, self.dense_sizes, overhead_s=float(getattr(self.policy, "overhead_s", 0)),
                                  batch_rows=padded, step_s=self.step_s)
            t = dec.batch_tokens // padded
        lengths = [min(t - 1, len(r)) for r in rows]
        return lengths, self._dense_tokens(len(rows), max(lengths) + 1)

    def draft_floor(self, requests: list[DraftRequest]) -> float:
        """The survival below which this round's packed schedule admits no draft (grid_costs.survival_floor): the
        drafter may stop a greedy batch's drafting where every row is below it, and the round verifies the same
        tokens. 0.0 (draft the whole block) unless this is a greedy batch ranked on a compiled step's grids."""
        if self.grid is None or not self.dense_sizes or self.policy.name not in ("prefix", "async_topk"):
            return 0.0
        if not all(r.sampling.greedy for r in requests):  # a sampled batch's lengths come from last round's rows
            return 0.0
        from dspark_core.modeling.compiled import bucket

        return survival_floor(self.grid, len(requests), self.dense_sizes, batch_rows=bucket(len(requests)),
                              overhead_s=float(getattr(self.policy, "overhead_s", 0)), boost=CAL_MAX)

    def _size(self, tokens: int) -> int:
        """The step size a row of `tokens` tokens runs in (modeling/compiled.py CompiledStep.t_bucket)."""
        return min([s for s in {1, *self.dense_sizes} if s >= tokens] or [tokens])

    def _dense_tokens(self, rows: int, tokens: int) -> int:
        """The tokens a compiled step runs for `rows` requests of up to `tokens` each: the rows padded to a power of
        two, each the smallest step size holding `tokens` (modeling/compiled.py)."""
        from dspark_core.modeling.compiled import bucket

        return bucket(rows) * self._size(tokens)

    def step_took(self, rows: int, tokens: int, seconds: float, real: int | None = None) -> None:
        """The target step of a round (`rows` requests x `tokens` each, up to its logits read) took `seconds`: on a
        compiled target, kept per padded shape (EMA), and the dense choice prices that shape with it from then on.
        The SPS probes run at a 64-token context on an idle machine; on chat at 8 requests the engine's 8 x 3 steps
        took 1.63x its 8 x 1 steps where the probes said 1.49x, so the scheduler chose 3-token rounds its drafts
        could not pay for."""
        if not self.dense_sizes or not self.learn_overhead or rows < 1:
            return
        if self.grid is not None:  # packed: the grid's correction, at the step's real tokens
            from dspark_core.modeling.compiled import bucket

            self.grid.observe((bucket(rows), self._size(tokens)), real if real is not None else rows * tokens, seconds)
            return
        key = self._dense_tokens(rows, tokens)
        old = self.step_s.get(key)
        self.step_s[key] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds

    def plain_round(self, requests: list[DraftRequest]) -> None:
        """A round where nothing was drafted: the round log records it (its seconds price a plain step)."""
        if self.log is None:
            return
        if self._round_start is None:
            self._round_start = time.perf_counter()
        n = len(requests)  # (no _batch: a plain step says nothing of the speculative rounds' overhead)
        self._seen = dict(running=n, waiting=self.waiting, confidence=[[] for _ in requests],
                          entropy=[[] for _ in requests],
                          recent_acceptance=[self.acceptance.get(r.slot) for r in requests],
                          verified=[0] * n, batch_tokens=n, drafted=[0] * n,
                          text=[text_features(r.tokens, self.classes) for r in requests],
                          context=[len(r.tokens) for r in requests])

    def observe(self, results: list[RoundResult]) -> None:
        now, start, seen = time.perf_counter(), self._round_start, self._seen
        self._observe_round_time(now)
        self._recalibrate(results)
        if self.log is not None and seen is not None and start is not None:
            seen["verified"] = [res.verified for res in results]
            self.log.write(RoundRecord(accepted=[res.accepted for res in results], seconds=now - start, **seen))
        self._seen = None
        for res in results:
            if not res.finished and self._features():
                self.acceptance.observe(res.slot, res.verified, res.accepted)
            if res.finished:
                self.acceptance.drop(res.slot)
                self.regulator.drop(res.slot)
            else:
                self.regulator.observe(res.slot, res.verified, res.accepted)


CAL_DECAY = 0.98  # per round: a proposer's calibration remembers ~50 rounds
CAL_PRIOR = 8.0  # tokens of "as calibrated" every factor starts from
CAL_MAX = 2.0  # the most a proposer's factor scales its rows' survival by


def ragged_rows(batch_tokens: int, rows: int) -> list[int]:
    """B verify tokens over `rows` requests, as evenly as possible (each row >= 1: its anchor)."""
    b = max(batch_tokens, rows)
    return [b // rows + (1 if r < b % rows else 0) for r in range(rows)]


def profile_target_sps(target: LeanModel, max_batch_tokens: int, *, rows: int = 1, context: int = 64,
                       repeats: int = 3, affine: bool = False, dense: tuple[int, ...] = (),
                       cache: KVCache | None = None, hidden_layers: tuple[int, ...] = ()) -> SpsTable:
    """Steps per second of one target forward over B verify tokens, in the round loop's shape.

    `rows` requests (slots with a `context`-token history each) append B tokens together, spread as evenly
    as possible (`ragged_rows`): the engine verifies ragged batches, so a step costs its real tokens (plus
    attention over the longest row). rows = 1 probes the default ladder; rows > 1 probes B = rows ..
    max_batch_tokens. `affine` (the engine on a CPU): fit step seconds = a + b * B by least squares over
    the probes and tabulate the fit at every B from 1 to max_batch_tokens. A CPU has no tile-quantisation
    cliffs to find (step time grows linearly with the tokens), and on shared cores the raw table carries
    jitter that the prefix scheduler's early stop would mistake for a cliff. The scratch cache is thrown
    away afterwards. `dense` (a compiled target's step sizes): the steps run dense, every row T tokens and the
    rows padded to a power of two, so each shape the engine can run (rows 1, 2, 4 .. x each size T) is timed
    itself, interleaved, and tabulated at its token count: the only counts the dense scheduler looks up. A line
    through them priced a 3-token step at 8 rows 20% under its time on this CPU (`affine` is not used). Given the
    engine's idle `cache` (all slots empty) and its drafter's `hidden_layers`, the probes run on them: the very
    graphs the engine will run, compiled once for both (a scratch cache is a shape of its own, hence other graphs).
    """
    import torch

    rows, cache, own = _probe_cache(target, max_batch_tokens, rows, context, dense, cache)

    def step(b: int) -> None:
        n_new = ragged_rows(b, rows)
        target(torch.randint(1, target.arch.vocab_size, (rows, max(n_new))), cache, list(range(rows)), n_new)
        for r in range(rows):
            cache.truncate(r, context)
        if target.device.type == "cuda":
            torch.cuda.synchronize()

    if dense:
        try:
            return _dense_sps(target, cache, context, rows, dense, max_batch_tokens, repeats,
                              hidden_layers if own else ())
        finally:
            cache.lens.zero_()  # the engine's cache goes back empty
    if rows == 1:
        probes = default_probes(max_batch_tokens)
    else:
        probes = list(range(rows, max_batch_tokens + 1))
    if not affine:
        return profile_sps(step, probes, warmup=1, repeats=repeats, max_batch_tokens=max_batch_tokens)
    import statistics

    probes = sorted({*probes[:: max(1, len(probes) // 12)], probes[-1]})  # a dozen points pin a line down
    times: dict[int, list[float]] = {b: [] for b in probes}
    for _ in range(max(3, repeats)):  # rounds over all probes: drifting load on shared cores hits all alike
        for b in probes:
            step(b)  # warm this shape
            t0 = time.perf_counter()
            step(b)
            times[b].append(time.perf_counter() - t0)
    return affine_sps([(b, statistics.median(ts)) for b, ts in times.items()], max_batch_tokens)


def _probe_cache(target: LeanModel, max_batch_tokens: int, rows: int, context: int, dense: tuple[int, ...],
                 cache: KVCache | None) -> tuple[int, KVCache, bool]:
    """The probes' rows (padded to a power of two for a compiled step), their cache with `context` tokens in each
    row's slot, and whether that is the engine's own (idle) cache."""
    import torch

    rows = max(1, min(rows, max_batch_tokens))
    if dense:  # the compiled step pads the rows to a power of two: probe the padded batch
        rows = 1 << (rows - 1).bit_length()
    longest = max(-(-max_batch_tokens // rows), *dense, 1)
    own = bool(dense) and cache is not None and len(cache.lens) >= rows and not bool(cache.lens.any()) \
        and cache.k[0].shape[1] >= context + longest + 1
    if not own:
        cache = target.new_cache(rows, context + longest + 1)
    assert cache is not None
    for r in range(rows):
        target(torch.randint(1, target.arch.vocab_size, (1, context)), cache, [r])
    return rows, cache, own


def profile_packed_sps(target: LeanModel, max_batch_tokens: int, *, rows: int, sizes: tuple[int, ...],
                       context: int = 64, repeats: int = 3, cache: KVCache | None = None,
                       hidden_layers: tuple[int, ...] = ()) -> tuple[SpsTable, GridCosts]:
    """A compiled target whose verify steps run packed (modeling/compiled.py `_core`'s `packed`): every grid probed full
    and at one real token a row (grid_costs.probe_grids), the SPS table of the full grids (as `_dense_sps`) for
    what reads one, and the grid costs the packed schedule prices rounds with."""
    rows, cache, own = _probe_cache(target, max_batch_tokens, rows, context, sizes, cache)
    try:
        grid = probe_grids(target, cache, context, rows, sizes, max_batch_tokens, repeats,
                           hidden_layers if own else ())
    finally:
        cache.lens.zero_()  # the engine's cache goes back empty
    return _table(grid.full, max_batch_tokens), grid


def _table(times: dict[tuple[int, int], float], max_batch_tokens: int) -> SpsTable:
    """b x T -> seconds as an SPS table by tokens: the slower where two shapes share a token count, made
    non-increasing in tokens."""
    by_tokens: dict[int, float] = {}
    for (b, t), sec in times.items():
        by_tokens[b * t] = max(by_tokens.get(b * t, 0.0), sec)
    tokens = sorted(by_tokens)
    sps = [1.0 / max(by_tokens[n], 1e-9) for n in tokens]
    for i in range(1, len(sps)):
        sps[i] = min(sps[i], sps[i - 1])
    return SpsTable.from_probes(zip(tokens, sps, strict=True), max(max_batch_tokens, tokens[-1]))


def _dense_sps(target: LeanModel, cache: KVCache, context: int, rows: int, sizes: tuple[int, ...],
               max_batch_tokens: int, repeats: int, hidden_layers: tuple[int, ...]) -> SpsTable:
    """Each dense shape (b rows x T tokens: b a power of two <= rows, T a step size or 1) timed in rounds over all
    shapes (grid_costs.probe_grids, full grids only); the table holds b x T -> 1 / seconds, the slower where two
    shapes share a token count, made non-increasing in tokens."""
    grid = probe_grids(target, cache, context, rows, sizes, max_batch_tokens, repeats, hidden_layers, low=False)
    return _table(grid.full, max_batch_tokens)


def affine_sps(times: list[tuple[int, float]], max_batch_tokens: int) -> SpsTable:
    """Least-squares fit of step seconds = a + b * B to (B, seconds) samples, tabulated at B = 1 ..
    max_batch_tokens (b clamped >= 0: a bigger batch is never cheaper)."""
    xs = [float(x) for x, _ in times]
    ys = [y for _, y in times]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var) if var > 0 else 0.0
    base = max(my - slope * mx, 1e-6)
    top = max_batch_tokens
    return SpsTable.from_probes([(b, 1.0 / (base + slope * b)) for b in range(1, top + 1)], top)


def build_verify_scheduler(config: EngineConfig, target: LeanModel, sps: SpsTable | None = None,
                           cache: KVCache | None = None, hidden_layers: tuple[int, ...] = ()) -> EngineScheduler:
    """The engine's scheduler for `config.spec` (entry point used by engine_parts.build_scheduler); `cache` and
    `hidden_layers`: the engine's idle KV cache and its drafter's layers, for a compiled target's SPS probes."""
    from dspark_core.config import learned_gamma

    spec = config.spec
    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=spec.block_size, adaptive=spec.adaptive_gamma,
                                         fallback_floor=spec.fallback_acceptance))
    if spec.scheduler == "learned" and not spec.policy_path:
        raise DSparkError("spec.scheduler is 'learned' but spec.policy_path is empty; train a policy with "
                          "`python cli.py train-policy` and set spec.policy_path to its JSON")
    learned = learned_gamma(config)
    if learned and not spec.gamma_policy_path:
        raise DSparkError("spec.gamma_policy is 'learned' but spec.gamma_policy_path is empty; train a policy with "
                          "`python cli.py train-gamma-policy` and set spec.gamma_policy_path to its JSON")
    gamma_policy = GammaPolicyFile.load(spec.gamma_policy_path) if learned and spec.gamma_policy_path else None
    logging = spec.round_log is not None
    dense = dense_sizes(target)  # a compiled target's step sizes: its steps run dense
    grid = None  # where its verify steps run packed: what each grid costs by its real tokens
    if sps is None and (spec.scheduler in ("prefix", "async_topk", "learned") or logging or gamma_policy):
        max_tokens = config.batch.max_requests * (min(spec.block_size, spec.max_verify_tokens) + 1)
        if spec.sps_path:
            sps = SpsTable.load(spec.sps_path)
        elif dense and packs(target):
            sps, grid = profile_packed_sps(target, max_tokens, rows=config.batch.max_requests, sizes=dense,
                                           cache=cache, hidden_layers=hidden_layers)
        else:
            sps = profile_target_sps(target, max_tokens, rows=config.batch.max_requests,
                                     affine=target.device.type == "cpu", dense=dense, cache=cache,
                                     hidden_layers=hidden_layers)
    # the round loop verifies ragged batches (model.py packs the real tokens): a batch costs sum(l_r + 1) tokens
    if spec.scheduler == "learned":
        assert sps is not None and spec.policy_path
        policy: Scheduler = LearnedScheduler(policy=PolicyFile.load(spec.policy_path), sps=sps)
    else:
        policy = make_scheduler(spec.scheduler, sps=sps, threshold=spec.confidence_threshold)
    log = RoundLog(Path(spec.round_log), spec.block_size, spec.scheduler, sps) if logging and sps else None
    explore = random.Random(config.seed) if spec.gamma_policy == "explore" else None
    return EngineScheduler(policy=policy, regulator=reg, max_verify=spec.max_verify_tokens, log=log,
                           gamma_policy=gamma_policy, sps=sps, explore=explore, dense_sizes=dense, grid=grid)


def dense_sizes(target: LeanModel) -> tuple[int, ...]:
    """The step sizes of a target whose decode / verify steps run compiled (dense rows x T), else ()."""
    step = getattr(target, "compiled", None)
    return tuple(step.sizes) if step is not None else ()


def packs(target: LeanModel) -> bool:
    """Whether the target's compiled verify steps run their real tokens packed (CompiledStep.pack, off under CUDA
    graphs, whose sizes are static)."""
    step = getattr(target, "compiled", None)
    return step is not None and bool(step.pack) and not step.use_graphs
