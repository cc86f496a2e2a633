"""DSpark and suffix decoding together: each round, each request takes the draft with the larger expected accepted
length (Arctic Inference's hybrid of suffix decoding and a model drafter, with DSpark as the model).

* Suffix decoding proposes first (~0.2 ms a step, from the request's and the finished requests' text). DSpark is a
  forward of its own (~3 ms a round for SmolLM2's drafter on an AVX512-BF16 CPU over its reduced draft vocabulary,
  ~6 ms over the whole one: 15-30% of a decode step), so it drafts only
  where it is expected to pay for itself. With A_m the tokens DSpark's drafts measured accepted per round (a running
  mean, starting at `model_prior`, and a probe every PROBE_EVERY rounds without it), q the share of the rows it
  drafted beside a suffix draft whose DSpark draft was taken (a running mean: a forward whose draft loses to
  suffix's gains nothing), c its forward's time over a round without it and E_s suffix's expectation per request:
  it drafts the requests with E_s < A_m when the tokens they gain, sum q (A_m - E_s), beat what the forward costs
  the batch, c x sum (1 + E_s). At one request that is q (A_m - E_s) > c (1 + E_s). Without q, on chat with the
  corpus DSpark drafted 12% of the rounds, half of its drafts lost to suffix's, and the hybrid ran 4% below
  suffix alone. Arctic Inference likewise runs its model drafter only where suffix's score is low;
  drafting both every round measured 1.58x plain against suffix alone's 2.12x.
* Expected accepted length of a draft = sum over k of P(its first k tokens all hold): DSpark's STS-calibrated
  confidences (P(token k survives | the ones before did)), suffix decoding's frequency ratios mapped to measured
  acceptance (`drafter.suffix_calibration`, suffix_calibration.py). Both are probabilities of the same event.
* Verification is unchanged, so it stays lossless: under sampling a suffix row's draft is a point mass (its `probs`
  row is one-hot), which rejection sampling treats exactly as n-gram's.
* `proposers` counts, per proposer, the request rounds it drafted and its proposed / verified / accepted tokens
  (`serve`'s /metrics: `dspark:spec_decode_proposer_*{proposer=...}`).
* A round where no request drafts is a one-token step, one where any does verifies a block (on this CPU ~1.3x the
  time): where suffix drafts nothing, DSpark pays only if (1 + A_m) tokens in a block round plus its forward beat
  one token in a one-token round, both round times measured here (`_Timer`, kept apart by whether the round drafted).
* DSpark's per-slot context (a projection of the target's hidden states of the committed tokens, whichever proposer
  drafted them: drafters/dspark_runtime.py) is brought up to date only when DSpark is about to draft the slot: the
  hidden states wait here (at most PENDING_MAX positions a slot), then go through one projection. On code, where
  suffix drafts most rounds, that projection each round cost 3% of the time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, ProposerCount, RoundResult
from dspark_core.drafters.suffix import SuffixDrafter
from dspark_core.drafters.suffix_tree import expected_accepted


class HybridDrafter(Drafter):
    """Per request and round, DSpark's draft or suffix decoding's, whichever expects more accepted tokens."""

    name = "hybrid"

    def __init__(self, model: Drafter, suffix: SuffixDrafter, model_prior: float = 1.0) -> None:
        self.model, self.suffix = model, suffix
        self.hidden_layers = model.hidden_layers
        self.gain = model_prior  # running mean of DSpark's accepted tokens per drafted round (prior: model_prior)
        self._rounds = 0  # DSpark rounds seen (the mean's weight: 1 / (rounds + 2), at least GAIN_RATE)
        self.taken = 1.0  # running share of DSpark's rows beside a suffix draft whose DSpark draft was taken
        self._contests = 0  # such rows seen (the share's weight, as the mean's)
        self._idle = 0  # rounds since DSpark last drafted (at PROBE_EVERY it drafts anyway: the mean stays current)
        self.cost = _Timer()  # DSpark's forward against a round without it
        self.proposers = {"suffix": ProposerCount(), "dspark": ProposerCount()}  # `serve`'s /metrics reads them
        self._took: dict[int, str] = {}  # slot -> the proposer of its draft this round
        self._pending: dict[int, list[torch.Tensor]] = {}  # slot -> hidden states [n, W] DSpark has not read yet
        self._held: dict[int, int] = {}  # slot -> positions in its pending states
        self._fresh: set[int] = set()  # slots whose pending states start at the prompt (DSpark's reset is due)

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        if hidden is None:  # DSpark's own error: the engine must pass the target's hidden states
            self.model.reset(slot, prompt, hidden)
        self.model.release(slot)
        self._pending[slot] = [] if hidden is None else [hidden]
        self._held[slot] = 0 if hidden is None else hidden.shape[0]
        self._fresh.add(slot)
        self.cost.skip()  # the interval holds this request's prefill: not a round's time
        self.suffix.reset(slot, prompt, hidden)

    def _catch_up(self, slots: list[int]) -> None:
        """Give DSpark the hidden states it has not read for `slots` (a reset for a new request, else one update)."""
        behind = []
        for slot in slots:
            chunks = self._pending.get(slot)
            if not chunks:
                continue
            self._pending[slot], self._held[slot] = [], 0
            hidden = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
            if slot in self._fresh:
                self._fresh.discard(slot)
                self.model.reset(slot, [], hidden)
            else:
                behind.append(RoundResult(slot=slot, proposed=0, verified=0, accepted=0, new_tokens=[], hidden=hidden))
        if behind:
            self.model.update(behind)

    def propose(self, requests: list[DraftRequest]) -> Proposal:
        self.cost.round_starts()
        ps = self.suffix.propose(requests)
        b = len(requests)
        e_s = _expected(ps)
        wants = self._model_rows(e_s, block=any(n > 0 for n in ps.num))
        ask = [r if w else replace(r, gamma=0) for r, w in zip(requests, wants, strict=True)]
        runs = any(r.gamma > 0 for r in ask)
        self._idle = 0 if runs else self._idle + 1
        if not runs:  # most rounds where suffix drafts well: its proposal as it is (no merge, no DSpark call)
            return self._suffix_only(requests, ps)
        with self.cost.model_call(runs):
            self._catch_up([r.slot for r in ask if r.gamma > 0])
            self.model.stop_below = self.stop_below
            pm = self.model.propose(ask)
        g = max(ps.tokens.shape[1], pm.tokens.shape[1])
        e_m = _expected(pm)
        tokens = torch.zeros(b, g, dtype=torch.long)
        conf = torch.full((b, g), 1e-3)
        probs = None if pm.probs is None else torch.zeros(b, g, pm.probs.shape[-1])
        num, source = [], []
        for i in range(b):
            use_suffix = ps.num[i] > 0 and e_s[i] >= e_m[i]
            p = ps if use_suffix else pm
            n = p.num[i]
            num.append(n)
            source.append("suffix" if use_suffix else "dspark")
            tokens[i, :n] = p.tokens[i, :n]
            if p.confidence is not None:
                conf[i, :n] = p.confidence[i, :n]
            if probs is not None:
                if use_suffix:  # a point mass on each drafted token
                    probs[i, torch.arange(n), tokens[i, :n]] = 1.0
                else:
                    probs[i, :n] = pm.probs[i, :n]  # type: ignore[index]
            if n > 0 and requests[i].gamma > 0:
                self._took[requests[i].slot] = "suffix" if use_suffix else "dspark"
            if not use_suffix:
                self.suffix.not_taken(requests[i].slot)
            if ask[i].gamma > 0 and ps.num[i] > 0 and pm.num[i] > 0:  # both drafted: did DSpark's forward pay?
                self._contests += 1
                self.taken += max(GAIN_RATE, 1.0 / (self._contests + 1)) * (float(not use_suffix) - self.taken)
        self.cost.drafted = any(n > 0 for n in num)
        return Proposal(tokens=tokens, num=num, probs=probs, confidence=conf, source=source)

    def _suffix_only(self, requests: list[DraftRequest], ps: Proposal) -> Proposal:
        """A round DSpark sits out: suffix's rows as drafted (the merge below would copy them one by one)."""
        for r, n in zip(requests, ps.num, strict=True):
            if n > 0 and r.gamma > 0:
                self._took[r.slot] = "suffix"
            elif n == 0:
                self.suffix.not_taken(r.slot)
        self.cost.drafted = any(n > 0 for n in ps.num)
        return replace(ps, source=["suffix" if n > 0 else "dspark" for n in ps.num])

    def _model_rows(self, e_s: list[float], block: bool) -> list[bool]:
        """Which requests DSpark drafts this round, suffix expecting e_s accepted tokens for each. Its forward is one
        for the batch: it runs where the tokens it adds, q x sum over its rows of (A_m - e), beat what its time costs
        the whole batch, share x sum of (1 + e); where suffix drafts for no request (`block` False) DSpark's rows must
        also pay for the block step they cause (`_Timer.block_pays`)."""
        if self._idle >= PROBE_EVERY:  # a probe: DSpark drafts where suffix is weak, whatever its mean says
            return [e < 1.0 for e in e_s]
        if not block:
            if self.cost.plain_due():  # a one-token round, timed: what DSpark's block round must beat
                return [False] * len(e_s)
            return [self.cost.block_pays(self.gain)] * len(e_s)
        gain = self.taken * sum(self.gain - e for e in e_s if e < self.gain)
        pays = gain > self.cost.share() * sum(1.0 + e for e in e_s)
        return [pays and e < self.gain for e in e_s]

    def update(self, results: list[RoundResult]) -> None:
        for res in results:
            who = self._took.pop(res.slot, None)
            if who is not None:
                c = self.proposers[who]
                c.drafts += 1
                c.proposed += res.proposed
                c.verified += res.verified
                c.accepted += res.accepted
                if who == "dspark":
                    self._rounds += 1
                    self.gain += max(GAIN_RATE, 1.0 / (self._rounds + 1)) * (res.accepted - self.gain)
            if res.finished:
                self._forget(res.slot)
            elif res.hidden is not None and res.slot in self._pending:
                self._pending[res.slot].append(res.hidden)
                self._held[res.slot] += res.hidden.shape[0]
        full = [slot for slot, n in self._held.items() if n > PENDING_MAX]
        self._catch_up(full)  # bounded memory: a long run of suffix rounds is read in one projection
        self.suffix.update(results)

    def release(self, slot: int) -> None:
        self._took.pop(slot, None)
        self._forget(slot)
        self.model.release(slot)
        self.suffix.release(slot)

    def _forget(self, slot: int) -> None:
        """Drop the hidden states DSpark has not read for `slot` (its request ended)."""
        self._pending.pop(slot, None)
        self._held.pop(slot, None)
        self._fresh.discard(slot)

    def forget(self) -> None:
        self.suffix.forget()

    def warm(self, rows: int) -> str:
        """DSpark's compiled round (the suffix proposer has nothing to compile)."""
        warm = getattr(self.model, "warm", None)
        return warm(rows) if warm is not None else ""


GAIN_RATE = 0.05  # weight of the newest round in DSpark's running mean of accepted tokens, once 20 were seen
PROBE_EVERY = 64  # rounds without DSpark after which it drafts once anyway (a stale mean would never recover)
PENDING_MAX = 256  # hidden-state positions a slot may hold back from DSpark before they are read anyway


class _Timer:
    """Running means of a round's wall time without DSpark's forward, apart for rounds that verified drafts (a block
    step) and rounds that drafted nothing (a one-token step), and of the forward's own time."""

    RATE = 0.1  # weight of the newest sample
    GAP = 10.0  # an interval this many times the mean is idle time (no request ran), not a round

    def __init__(self) -> None:
        self.round_s: float | None = None  # mean round that verified drafts, without the forward
        self.plain_s: float | None = None  # mean round that drafted nothing
        self.model_s: float | None = None  # mean forward
        self.drafted = False  # the round being timed verifies drafts (set by the hybrid's propose)
        self._start: float | None = None  # when the previous round started
        self._spent = 0.0  # the forward's time inside the previous round
        self._plain_age = 0  # rounds since a one-token round was timed

    def skip(self) -> None:
        """The interval now running is not a round's time (a prefill ran in it): the next round start drops it."""
        self._start = None

    def round_starts(self) -> None:
        now = time.perf_counter()
        if self._start is not None:
            took = now - self._start - self._spent
            mean = _fold(self.round_s if self.drafted else self.plain_s, took, self.RATE, self.GAP)
            if self.drafted:
                self.round_s = mean
            else:
                self.plain_s, self._plain_age = mean, 0
        self._start, self._spent = now, 0.0
        self._plain_age += 1

    def plain_due(self) -> bool:
        """No one-token round was timed yet, or none for PROBE_EVERY rounds (the mean would go stale)."""
        return self.plain_s is None or self._plain_age >= PROBE_EVERY

    @contextmanager
    def model_call(self, runs: bool) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if runs:
            self._spent = took = time.perf_counter() - t0
            self.model_s = _fold(self.model_s, took, self.RATE, self.GAP)

    def share(self) -> float:
        """The forward's cost over a round without it (0 until both were timed)."""
        if not self.round_s or self.model_s is None:
            return 0.0
        return self.model_s / self.round_s

    def block_pays(self, gain: float) -> bool:
        """Where no request drafts otherwise: does a block round with DSpark's forward and `gain` accepted tokens a
        request beat a one-token round? Before both kinds were timed, its forward against the round alone."""
        if not self.plain_s or not self.round_s or self.model_s is None:
            return gain > self.share()
        plain = min(self.plain_s, self.round_s)  # a one-token step is never slower than a block step (warm-up is)
        return (1.0 + gain) * plain > self.round_s + self.model_s


def _fold(mean: float | None, took: float, rate: float, gap: float) -> float:
    """A running mean with `took` folded in. The first sample, or one `gap` times faster than the mean (the mean held
    a warm-up: the forward that compiled the drafter's graphs), replaces it; one `gap` times slower (a compile of a
    new shape, a stall) is left out. Without that, the compiling first forward (tens of seconds) priced DSpark out
    of every round until its probes had averaged it away."""
    if mean is None or took * gap < mean:
        return took
    if took < gap * mean:
        return mean + rate * (took - mean)
    return mean


def _expected(p: Proposal) -> list[float]:
    """Each row's expected accepted length from its confidences (0 for a proposal without them)."""
    if p.confidence is None:
        return [0.0] * len(p.num)
    return [expected_accepted(p.confidence[i, :n].tolist()) for i, n in enumerate(p.num)]


def build_drafter(config, target) -> HybridDrafter:  # noqa: ANN001 - EngineConfig, LeanModel
    """Registry entry: the DSpark drafter of `drafter.path` / `spec.head` and suffix decoding of `drafter.suffix_*`."""
    from dspark_core.drafters.dspark_runtime import build_runtime
    from dspark_core.drafters.suffix import build_drafter as build_suffix

    return HybridDrafter(build_runtime(config, target), build_suffix(config, target))
