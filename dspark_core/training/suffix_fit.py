"""Fitting suffix decoding's calibration on offline greedy rounds (drafters/suffix_calibration.py).

On a greedy target continuation the target's next token after any prefix is the sequence's next token, so the
engine's greedy rounds with suffix decoding are fully determined offline, with no target forward: the prefill
commits the first token, then each round proposes from the committed text, accepts while the draft equals the
sequence, and commits the accepted tokens plus the target's own (tests/dspark_core/test_suffix_calibration.py checks
this against the engine, round for round).
The sequences run one after another, each finished one joining the global tree, as requests do in `serve`.
Every drafted token that was reached (all before it accepted) of every tree's draft (the request's own, the global
one, the corpus) is a row: its features and whether it was accepted. A logistic model is fitted by Newton's method
on the rows of the first half of the sequences and scored on the second half: Brier score, calibration error, and
the expected accepted length per round against the measured one. The tree a round drafts from is the one the
calibration picks, so the fit runs twice: the rounds of the second pass are those of the first pass's calibration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from dspark_core.drafters.base import DraftRequest, RoundResult
from dspark_core.drafters.suffix import SuffixDrafter, best_of
from dspark_core.drafters.suffix_calibration import FEATURES, SuffixCalibration, features
from dspark_core.drafters.suffix_tree import expected_accepted
from dspark_core.verification.sampling import SamplingParams


@dataclass
class SuffixRows:
    """Reached drafted tokens of simulated rounds."""

    x: list[list[float]] = field(default_factory=list)  # [N][len(FEATURES)] features
    y: list[float] = field(default_factory=list)  # [N] 1 = accepted
    ratio: list[float] = field(default_factory=list)  # [N] the raw frequency ratio
    rounds: list[tuple[list[list[float]], list[float], int]] = field(default_factory=list)  # per round: features,
    # raw ratios of every drafted token, accepted count
    sequence: list[int] = field(default_factory=list)  # [N] index of the sequence the row came from
    round_sequence: list[int] = field(default_factory=list)  # per round: its sequence


def _accepted(tokens: list[int], seq: list[int], p: int) -> int:
    """Leading drafted tokens equal to the greedy sequence from position p (what greedy verification accepts)."""
    acc = 0
    while acc < len(tokens) and tokens[acc] == seq[p + acc]:
        acc += 1
    return acc


def suffix_rounds(seqs: list[tuple[list[int], int]], drafter: SuffixDrafter, gamma: int) -> SuffixRows:
    """Simulate greedy rounds over `seqs` = (prompt + greedy continuation, prompt length), in order. The round
    drafts with what the drafter picks (its calibration, else the raw ratios, chooses the tree); every tree's draft
    is scored against the sequence and gives rows, so each tree's acceptance is measured whichever one was picked."""
    rows = SuffixRows()
    greedy = SamplingParams()
    for i, (toks, plen) in enumerate(seqs):
        drafter.reset(0, toks[:plen], None)
        p = plen + 1  # tokens committed (the prefill writes the first one, undrafted); toks[p] is the target's next
        while p < len(toks):
            g = min(gamma, len(toks) - p - 1)
            req = DraftRequest(slot=0, tokens=toks[:p], gamma=g, sampling=greedy, prompt_len=plen)
            every = drafter.drafts(req)
            d = best_of(every)
            for e in every if d is not None else ():
                a = _accepted(e.tokens, toks, p)
                for k in range(min(a + 1, len(e.tokens))):  # reached: every token up to the first rejection
                    rows.x.append(features(e.ratios[k], e.supports[k], e.match, k, e.source))
                    rows.y.append(1.0 if k < a else 0.0)
                    rows.ratio.append(e.ratios[k])
                    rows.sequence.append(i)
            acc = 0
            if d is not None:
                acc = _accepted(d.tokens, toks, p)
                feats = [features(r, n, d.match, k, d.source) for k, (r, n) in enumerate(zip(d.ratios, d.supports,
                                                                                             strict=True))]
                rows.rounds.append((feats, d.ratios, acc))
                rows.round_sequence.append(i)
            new = toks[p:p + acc + 1]
            drafter.update([RoundResult(slot=0, proposed=len(d.tokens) if d else 0, verified=acc, accepted=acc,
                                        new_tokens=new)])
            p += len(new)
        drafter.release(0)
    return rows


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float = 1e-3, iters: int = 50) -> torch.Tensor:
    """Weights w maximising sum log sigmoid(+-x.w) - l2/2 |w|^2 (Newton's method, float64)."""
    x, y = x.double(), y.double()
    w = torch.zeros(x.shape[1], dtype=torch.float64)
    eye = torch.eye(x.shape[1], dtype=torch.float64) * l2 * len(y)
    for _ in range(iters):
        p = torch.sigmoid(x @ w)
        grad = x.T @ (p - y) + eye @ w
        hess = (x * (p * (1 - p))[:, None]).T @ x + eye
        step = torch.linalg.solve(hess, grad)
        w -= step
        if float(step.abs().max()) < 1e-8:
            break
    return w


def _ece(p: torch.Tensor, y: torch.Tensor, bins: int = 10) -> float:
    """Expected calibration error over equal-width probability bins."""
    idx = (p * bins).long().clamp(max=bins - 1)
    err = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            err += float(m.sum()) / len(p) * abs(float(p[m].mean()) - float(y[m].mean()))
    return err


NO_TREE = FEATURES.index("global")  # the features before the tree's: the model fitted without them, for comparison


def _tree(x: torch.Tensor) -> torch.Tensor:
    """[N] each row's tree: 0 the request's own, 1 global, 2 the corpus (from its indicator features)."""
    return x[:, FEATURES.index("global")].long() + 2 * x[:, FEATURES.index("corpus")].long()


def score(w: torch.Tensor, rows: SuffixRows, keep: set[int], w_no_tree: torch.Tensor | None = None
          ) -> dict[str, Any]:
    """Errors of the raw ratios and of the calibrated model on the rows of the sequences in `keep`, overall and by
    tree; with `w_no_tree`, the Brier score of a model fitted without the tree features too."""
    m = torch.tensor([s in keep for s in rows.sequence])
    x, y = torch.tensor(rows.x, dtype=torch.float64)[m], torch.tensor(rows.y, dtype=torch.float64)[m]
    raw = torch.tensor(rows.ratio, dtype=torch.float64)[m]
    cal = torch.sigmoid(x @ w)
    plain = torch.sigmoid(x[:, :NO_TREE] @ w_no_tree) if w_no_tree is not None else None
    rounds = [r for r, s in zip(rows.rounds, rows.round_sequence, strict=True) if s in keep]
    measured = sum(a for _, _, a in rounds) / max(1, len(rounds))
    pred_raw = sum(expected_accepted(ratios) for _, ratios, _ in rounds) / max(1, len(rounds))
    pred_cal = sum(expected_accepted(torch.sigmoid(torch.tensor(f, dtype=torch.float64) @ w).tolist())
                   for f, _, _ in rounds) / max(1, len(rounds))
    trees = {}
    for i, name in enumerate(("own", "global", "corpus")):
        t = _tree(x) == i
        if t.any():
            trees[name] = {"rows": int(t.sum()), "accept_rate": round(float(y[t].mean()), 4),
                           "predicted_calibrated": round(float(cal[t].mean()), 4),
                           "brier_calibrated": round(float(((cal[t] - y[t]) ** 2).mean()), 4),
                           **({"predicted_without_trees": round(float(plain[t].mean()), 4),
                               "brier_without_trees": round(float(((plain[t] - y[t]) ** 2).mean()), 4)}
                              if plain is not None else {})}
    return {"rows": int(m.sum()), "rounds": len(rounds), "accept_rate": round(float(y.mean()), 4),
            "brier_raw": round(float(((raw - y) ** 2).mean()), 4), "brier_calibrated": round(float(((cal - y) ** 2)
                                                                                                  .mean()), 4),
            **({"brier_without_trees": round(float(((plain - y) ** 2).mean()), 4)} if plain is not None else {}),
            "ece_raw": round(_ece(raw, y), 4), "ece_calibrated": round(_ece(cal, y), 4),
            "accepted_per_round_measured": round(measured, 4), "accepted_per_round_raw": round(pred_raw, 4),
            "accepted_per_round_calibrated": round(pred_cal, 4), "by_tree": trees}


def _fit(seqs: list[tuple[list[int], int]], drafter: SuffixDrafter, gamma: int
         ) -> tuple[torch.Tensor, SuffixRows, list[int]]:
    """Simulate (from an empty global tree), then fit on the rows of the first half of the sequences; the weights,
    the rows and which of them were fitted on."""
    drafter.forget()
    rows = suffix_rounds(seqs, drafter, gamma)
    half = len(seqs) // 2
    fit = [i for i, s in enumerate(rows.sequence) if s < half]
    if len(fit) < 2 * len(FEATURES) or len(set(rows.y[i] for i in fit)) < 2:
        raise ValueError(f"only {len(fit)} drafted tokens to fit on, or all with one outcome; use more or longer "
                         "sequences")
    w = fit_logistic(torch.tensor([rows.x[i] for i in fit]), torch.tensor([rows.y[i] for i in fit]))
    if not all(math.isfinite(v) for v in w.tolist()):
        raise ValueError("the fit diverged; use more sequences")
    return w, rows, fit


def fit_calibration(seqs: list[tuple[list[int], int]], drafter: SuffixDrafter, gamma: int,
                    fitted_on: dict) -> SuffixCalibration:
    """Simulate and fit twice (the second pass's rounds pick trees by the first fit), score on the second half."""
    drafter.calibration = None  # the first pass picks by the raw ratios
    w, _, _ = _fit(seqs, drafter, gamma)
    drafter.calibration = SuffixCalibration(features=list(FEATURES), weights=w.tolist())
    w, rows, fit = _fit(seqs, drafter, gamma)
    half = len(seqs) // 2
    w_no_tree = fit_logistic(torch.tensor([rows.x[i][:NO_TREE] for i in fit]), torch.tensor([rows.y[i] for i in fit]))
    fitted = score(w, rows, set(range(half)), w_no_tree)
    held = score(w, rows, set(range(half, len(seqs))), w_no_tree)
    return SuffixCalibration(features=list(FEATURES), weights=[round(v, 6) for v in w.tolist()],
                             fitted_on={**fitted_on, "sequences": half, "gamma": gamma, **fitted},
                             heldout={"sequences": len(seqs) - half, **held})
