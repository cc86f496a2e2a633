"""Greedy identity of a method's outputs against plain decoding, reported honestly.

In bfloat16 a 1-row and a 9-row GEMM round differently, so a speculative method's greedy output can leave plain
decoding's at a near-tie of the target's top two logits. For each method: the share of prompts whose outputs are
token-identical to plain's, and the first divergence (prompt, position, the two tokens, and the target's top-2 logit
margin there, from one forward over the prompt and plain's output up to that position). A small margin says the
divergence is a rounding tie, not a drafter or verification bug; a large one would be a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel


@dataclass
class Divergence:
    """Where a method's greedy output first leaves plain decoding's."""

    prompt: int  # prompt index
    position: int  # generated-token index of the first difference
    plain_token: int  # what plain decoding chose there
    method_token: int | None  # what the method chose (None: its output ended)
    top2_margin: float  # target logit(top-1) - logit(top-2) at that position


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or where the shorter ends), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def identity(target: LeanModel, prompts: list[list[int]], plain: list[list[int]], outputs: list[list[int]]
             ) -> tuple[float, Divergence | None]:
    """(share of prompts with identical outputs, the first divergence in prompt order or None)."""
    same = 0
    first: Divergence | None = None
    for i, (ids, p, o) in enumerate(zip(prompts, plain, outputs, strict=True)):
        pos = first_difference(p, o)
        if pos is None:
            same += 1
            continue
        if first is None and pos < len(p):
            x = torch.tensor([ids + p[:pos]], device=target.device)
            logits = target.forward_full(x)[0][0, -1].float()
            top = logits.topk(2).values
            first = Divergence(prompt=i, position=pos, plain_token=p[pos],
                               method_token=o[pos] if pos < len(o) else None,
                               top2_margin=round(float(top[0] - top[1]), 4))
    return same / max(1, len(prompts)), first
