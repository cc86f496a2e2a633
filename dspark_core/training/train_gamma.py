"""Train the learned block length (`spec.gamma_policy: learned`) from round logs: a model-based contextual bandit.

Context: per request, the text features of its committed tokens and its rolling acceptance (gamma_policy.py).
Action: the round's block G in 0..gamma_max (0 = a plain step). Reward: committed tokens per second of the batch.
Two models are fitted, then one parameter on the reward itself:
- acceptance: a logistic model of P(position j survives | positions < j survived) on every position whose outcome a
  log shows (j <= min(verified, accepted + 1));
- cost: the round's measured seconds beyond the log's SPS step at its verify batch, as an affine function of
  gamma_policy.COST_TERMS (rows, context, and when anything is drafted the drafting rows, G, rows x G), least squares
  on every logged round but the slowest 5% (hiccups of shared cores). It needs plain rounds (log the traffic once with
  the plain method: a plain step's real cost, attention over long contexts included, is measured, not assumed from
  the SPS table) and two block lengths or more (one length says nothing of the per-position cost).
- a logit shift on the acceptance estimates, chosen by the priced throughput of the training rounds.
Pricing a round under another block: a full-information round (logged under verify_all, every drafted token verified)
commits min(G, drafted, accepted) + 1 tokens per request at block G, exactly: the first G drafted tokens do not depend
on the block (the backbone always runs the trained block; the head samples left to right). The score of a policy is
sum(tokens) / sum(modelled seconds) over the held-out rounds (the last share of each log).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_core.errors import DSparkError
from dspark_core.training.train_policy import SHIFTS, fit_logistic
from dspark_core.verification.acceptance_model import sigmoid
from dspark_core.verification.gamma_policy import (
    COST_TERMS,
    GAMMA_FEATURES,
    GammaPolicyFile,
    choose_blocks,
    cost_row,
    feature_row,
)
from dspark_core.verification.round_log import read_log
from dspark_core.verification.sps import SpsTable


@dataclass
class GammaRound:
    """One logged round, as the block-length policy sees it."""

    drafted: list[int]  # [request] tokens drafted (all 0: a plain step)
    verified: list[int]  # [request] tokens verified
    accepted: list[int]  # [request] accepted prefix
    recent: list[float]  # [request] rolling acceptance before the round
    text: list[list[float]]  # [request] text features before the round
    context: list[int]  # [request] committed tokens before the round
    seconds: float  # measured round
    batch_tokens: int  # verify batch
    sps: SpsTable  # the log's table
    full: bool  # logged under verify_all with every drafted token verified: priceable at any block <= drafted
    log: int  # which log
    heldout: bool = False  # in the last share of its log

    @property
    def rows(self) -> int:
        return len(self.drafted)


def load_gamma_rounds(paths: Sequence[str | Path], heldout: float = 0.2) -> list[GammaRound]:
    """Rounds of every log (plain steps included); the last `heldout` share of each log is marked held out."""
    out: list[GammaRound] = []
    for i, path in enumerate(paths):
        header, records = read_log(path)
        sps = header.sps_table()
        kept = []
        for n, rec in enumerate(records):
            drafted = rec.drafted or rec.verified
            if len(rec.text) != rec.running or len(rec.context) != rec.running:
                raise DSparkError(f"{path}: round {n + 1} has no text features or context lengths (a log written "
                                  "before gamma_policy existed); log the traffic again")
            full = header.scheduler == "verify_all" and rec.verified == drafted
            kept.append(GammaRound(drafted=drafted, verified=rec.verified, accepted=rec.accepted,
                                   recent=rec.recent_acceptance, text=rec.text, context=rec.context,
                                   seconds=rec.seconds,
                                   batch_tokens=rec.batch_tokens, sps=sps, full=full, log=i))
        for k, r in enumerate(kept):
            r.heldout = heldout > 0 and len(kept) > 1 and k >= len(kept) * (1.0 - heldout)
        out += kept
    if not out:
        raise DSparkError(f"no speculative rounds in {', '.join(map(str, paths))}; log a run that drafts "
                          "(a DSpark drafter, spec.round_log set)")
    return out


def fit_cost(rounds: Sequence[GammaRound], trim: float = 0.05) -> list[float]:
    """Seconds beyond the SPS step = c . COST_TERMS, >= 0 coefficients, least squares without the slowest `trim`."""
    if not any(not any(r.drafted) for r in rounds):
        raise DSparkError("the logs hold no plain step, so a plain round's cost is unknown; log the traffic with "
                          "spec.gamma_policy explore (or once with the plain method)")
    if len({max(r.drafted) for r in rounds if any(r.drafted)}) < 2:
        raise DSparkError("the logs show one block length only, which cannot price a longer or shorter block; log "
                          "the traffic with spec.gamma_policy explore (or at two block lengths or more)")
    x = torch.tensor([cost_row(r.rows, sum(r.context), sum(d > 0 for d in r.drafted), max(r.drafted))
                      for r in rounds], dtype=torch.float64)
    y = torch.tensor([r.seconds - 1.0 / r.sps.lookup(r.batch_tokens) for r in rounds], dtype=torch.float64)
    keep = y <= torch.quantile(y, 1.0 - trim)
    x, y = x[keep], y[keep]
    active = list(range(len(COST_TERMS)))
    while True:
        sol = torch.linalg.lstsq(x[:, active], y, driver="gelsd").solution
        neg = [a for a, c in zip(active, sol.tolist(), strict=True) if c < 0]
        if not neg or len(active) == 1:
            break
        active = [a for a in active if a != neg[0]]  # a negative cost term is noise: drop it and refit
    coef = [0.0] * len(COST_TERMS)
    for a, c in zip(active, sol.tolist(), strict=True):
        coef[a] = max(0.0, c)
    return coef


def _logits(policy: GammaPolicyFile, r: GammaRound, gamma: int) -> list[list[float]]:
    """Acceptance logits (no shift) per request and position 1..gamma."""
    return [[policy.raw_logit(feature_row(j, rec, txt)) for j in range(1, gamma + 1)]
            for rec, txt in zip(r.recent, r.text, strict=True)]


def _survival(logits: list[list[float]], shift: float) -> list[list[float]]:
    out = []
    for row in logits:
        alive, surv = 1.0, []
        for z in row:
            alive *= sigmoid(z + shift)
            surv.append(alive)
        out.append(surv)
    return out


def priced(policy: GammaPolicyFile, r: GammaRound, lens: Sequence[int]) -> tuple[float, float]:
    """(committed tokens, modelled seconds) of full-information round r had request i drafted lens[i] tokens."""
    toks = sum(1 + min(n, a) for n, a in zip(lens, r.accepted, strict=True))
    batch = min(r.rows + sum(lens), r.sps.max_batch_tokens)
    extra = policy.extra_seconds(r.rows, sum(r.context), sum(n > 0 for n in lens), max(lens))
    return float(toks), 1.0 / r.sps.lookup(batch) + extra


def score(policy: GammaPolicyFile, rounds: Sequence[GammaRound],
          pick: Callable[[int, GammaRound], Sequence[int]]) -> float:
    """Committed tokens per modelled second over `rounds` when round i drafts pick(i, round) tokens per request."""
    toks = secs = 0.0
    for i, r in enumerate(rounds):
        t, s = priced(policy, r, pick(i, r))
        toks, secs = toks + t, secs + s
    return toks / secs if secs else 0.0


def train_gamma_policy(rounds: list[GammaRound], on_step: Callable[[int, int], None] | None = None
                       ) -> tuple[GammaPolicyFile, dict[str, float]]:
    """Fit on the training rounds; compare every static block, the learned pick and a per-round oracle on the
    held-out full-information rounds."""
    train = [r for r in rounds if not r.heldout]
    gmax = max(max(r.drafted) for r in rounds)
    x, y = [], []
    for r in train:
        for d, v, a, rec, txt in zip(r.drafted, r.verified, r.accepted, r.recent, r.text, strict=True):
            for j in range(1, min(d, v, a + 1) + 1):
                x.append(feature_row(j, rec, txt))
                y.append(float(j <= a))
    if not y:
        raise DSparkError("the training rounds verified no draft token; log more rounds")
    mean, scale, w = fit_logistic(torch.tensor(x), torch.tensor(y))
    policy = GammaPolicyFile(features=list(GAMMA_FEATURES), mean=mean.tolist(), scale=scale.tolist(),
                             weights=w.tolist(), cost_terms=list(COST_TERMS), cost=fit_cost(rounds), gamma_max=gmax)
    full_train = [r for r in train if r.full and max(r.drafted) == gmax]
    test = [r for r in rounds if r.heldout and r.full and max(r.drafted) == gmax]
    if not full_train or not test:
        raise DSparkError(f"no full-information rounds at block {gmax} to price the policy on; log one run under "
                          "spec.scheduler verify_all at the longest block")
    logits = {id(r): _logits(policy, r, gmax) for r in [*full_train, *test]}

    def learned(shift: float) -> Callable[[int, GammaRound], int]:
        return lambda _, r: choose_blocks(policy, r.sps, _survival(logits[id(r)], shift), r.drafted, gmax,
                                          sum(r.context))

    best = -1.0
    for i, s in enumerate(SHIFTS):
        val = score(policy, full_train, learned(s))
        if val > best:
            best, policy.shift = val, s
        if on_step is not None:
            on_step(i + 1, len(SHIFTS))
    static = {g: score(policy, test, lambda _, r, g=g: [min(g, d) for d in r.drafted]) for g in range(gmax + 1)}
    best_static = max(static, key=lambda g: static[g])
    picks = [learned(policy.shift)(0, r) for r in test]
    drafting = [n for p in picks for n in p if n]
    # knowing each acceptance: the same choice on survival 1 up to the accepted prefix, 0 beyond
    oracle = [choose_blocks(policy, r.sps, [[float(j < a) for j in range(gmax)] for a in r.accepted], r.drafted, gmax,
                            sum(r.context)) for r in test]
    scores: dict[str, float] = {
        **{f"static_{g}": v for g, v in static.items()}, "best_static_block": best_static,
        "best_static": static[best_static], "learned": score(policy, test, lambda i, _: picks[i]),
        "oracle": score(policy, test, lambda i, _: oracle[i]),
        "learned_train": best, "shift": policy.shift, "rounds_train": len(train), "rounds_heldout": len(test),
        "mean_block_learned": statistics.fmean(drafting) if drafting else 0.0,
        "plain_share_learned": sum(n == 0 for p in picks for n in p) / sum(len(p) for p in picks)}
    policy.trained_on = {k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()}
    return policy, scores
