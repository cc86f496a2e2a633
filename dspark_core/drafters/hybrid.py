"""DSpark and suffix decoding together: each round, each request takes the draft with the larger expected accepted
length (Arctic Inference's hybrid of suffix decoding and a model drafter, with DSpark as the model).

* Suffix decoding proposes first (~0.2 ms a step, from the request's and the finished requests' text). DSpark is a
  forward of its own (~6 ms a step for SmolLM2's drafter on this CPU, 20% of a decode step), so it drafts a request
  only where it is expected to pay for itself: where suffix's expected tokens per round, 1 + E_s, fall below
  DSpark's, (1 + A_m) / (1 + c), with A_m the tokens DSpark's drafts measured accepted per round (a running mean,
  starting at `model_prior`, and a probe every PROBE_EVERY rounds without it) and c its forward's cost over a
  round without it (both timed here, as running means). Arctic Inference likewise runs its model drafter only
  where suffix's score is low; drafting both every round measured 1.58x plain against suffix alone's 2.12x.
* Expected accepted length of a draft = sum over k of P(its first k tokens all hold): DSpark's STS-calibrated
  confidences (P(token k survives | the ones before did)), suffix decoding's frequency ratios mapped to measured
  acceptance (`drafter.suffix_calibration`, suffix_calibration.py). Both are probabilities of the same event.
* Verification is unchanged, so it stays lossless: under sampling a suffix row's draft is a point mass (its `probs`
  row is one-hot), which rejection sampling treats exactly as n-gram's.
* `proposers` counts, per proposer, the request rounds it drafted and its proposed / verified / accepted tokens
  (`serve`'s /metrics: `dspark:spec_decode_proposer_*{proposer=...}`).
* Both drafters see every reset, update and release: DSpark's per-slot state is written from the target's hidden
  states of the committed tokens, whichever proposer drafted them (drafters/dspark_runtime.py).
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
        self._idle = 0  # rounds since DSpark last drafted (at PROBE_EVERY it drafts anyway: the mean stays current)
        self.cost = _Timer()  # DSpark's forward against a round without it
        self.proposers = {"suffix": ProposerCount(), "dspark": ProposerCount()}  # `serve`'s /metrics reads them
        self._took: dict[int, str] = {}  # slot -> the proposer of its draft this round

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        self.model.reset(slot, prompt, hidden)
        self.suffix.reset(slot, prompt, hidden)

    def propose(self, requests: list[DraftRequest]) -> Proposal:
        self.cost.round_starts()
        ps = self.suffix.propose(requests)
        b = len(requests)
        e_s = _expected(ps)
        bar = (1.0 + self.gain) / (1.0 + self.cost.share()) - 1.0  # DSpark pays where suffix expects fewer
        if self._idle >= PROBE_EVERY:  # a probe: DSpark drafts where suffix is weak, whatever its mean says
            bar = max(bar, 1.0)
        ask = [r if e < bar else replace(r, gamma=0) for r, e in zip(requests, e_s, strict=True)]
        runs = any(r.gamma > 0 for r in ask)
        self._idle = 0 if runs else self._idle + 1
        with self.cost.model_call(runs):
            pm = self.model.propose(ask)
        g = max(ps.tokens.shape[1], pm.tokens.shape[1])
        e_m = _expected(pm)
        tokens = torch.zeros(b, g, dtype=torch.long)
        conf = torch.full((b, g), 1e-3)
        probs = None if pm.probs is None else torch.zeros(b, g, pm.probs.shape[-1])
        num = []
        for i in range(b):
            use_suffix = ps.num[i] > 0 and e_s[i] >= e_m[i]
            p = ps if use_suffix else pm
            n = p.num[i]
            num.append(n)
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
        return Proposal(tokens=tokens, num=num, probs=probs, confidence=conf)

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
        self.model.update(results)
        self.suffix.update(results)

    def release(self, slot: int) -> None:
        self._took.pop(slot, None)
        self.model.release(slot)
        self.suffix.release(slot)

    def forget(self) -> None:
        self.suffix.forget()


GAIN_RATE = 0.05  # weight of the newest round in DSpark's running mean of accepted tokens, once 20 were seen
PROBE_EVERY = 64  # rounds without DSpark after which it drafts once anyway (a stale mean would never recover)


class _Timer:
    """Running means of a round's wall time without DSpark's forward and of the forward's own time."""

    RATE = 0.1  # weight of the newest sample
    GAP = 10.0  # an interval this many times the mean is idle time (no request ran), not a round

    def __init__(self) -> None:
        self.round_s: float | None = None  # mean round without the forward
        self.model_s: float | None = None  # mean forward
        self._start: float | None = None  # when the previous round started
        self._spent = 0.0  # the forward's time inside the previous round

    def round_starts(self) -> None:
        now = time.perf_counter()
        if self._start is not None:
            took = now - self._start - self._spent
            if self.round_s is None:
                self.round_s = took
            elif took < self.GAP * self.round_s:
                self.round_s += self.RATE * (took - self.round_s)
        self._start, self._spent = now, 0.0

    @contextmanager
    def model_call(self, runs: bool) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if runs:
            self._spent = took = time.perf_counter() - t0
            self.model_s = took if self.model_s is None else self.model_s + self.RATE * (took - self.model_s)

    def share(self) -> float:
        """The forward's cost over a round without it (0 until both were timed)."""
        if not self.round_s or self.model_s is None:
            return 0.0
        return self.model_s / self.round_s


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
