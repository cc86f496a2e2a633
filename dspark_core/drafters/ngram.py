"""Prompt-lookup (n-gram) drafting: copy what followed the most recent earlier match of the suffix.

Deterministic (a point-mass draft, `probs = None`), so verification is still lossless under sampling.
No per-slot state beyond the tokens the engine passes in.
"""

from __future__ import annotations

import torch

from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult


def lookup(tokens: list[int], gamma: int, max_n: int, min_n: int) -> list[int]:
    """Up to `gamma` tokens that followed the latest earlier occurrence of the longest matching suffix."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n :]
        for start in range(size - n - 1, -1, -1):  # most recent earlier occurrence first
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + gamma]
    return []


class NgramDrafter(Drafter):
    """Prompt lookup decoding over the request's own prompt and output."""

    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        return None

    def propose(self, requests: list[DraftRequest]) -> Proposal:
        drafts = [lookup(r.tokens, r.gamma, self.max_n, self.min_n) if r.gamma > 0 else [] for r in requests]
        g = max((len(d) for d in drafts), default=0)
        tokens = torch.zeros(len(requests), g, dtype=torch.long)
        for i, d in enumerate(drafts):
            tokens[i, : len(d)] = torch.tensor(d, dtype=torch.long)
        return Proposal(tokens=tokens, num=[len(d) for d in drafts])

    def update(self, results: list[RoundResult]) -> None:
        return None


def build_drafter(config, target) -> NgramDrafter:  # noqa: ANN001 - EngineConfig, LeanModel
    """Registry entry: n-gram sizes from `config.drafter`."""
    return NgramDrafter(config.drafter.ngram_max, config.drafter.ngram_min)
