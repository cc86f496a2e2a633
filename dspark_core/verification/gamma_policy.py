"""The learned block length (`spec.gamma_policy: learned`): how many tokens the next round drafts, from the text.

The seed's dynamic block-length regulator lengthens gamma for structured text such as code. Built as a model-based
contextual bandit, like the learned verify length (learned.py): a logistic model estimates P(position j survives |
positions < j survived) for the round about to be drafted from what the request's recent text and rounds show (the
token-class statistics of its last tokens, how much of it repeats earlier context, its rolling acceptance, the
position j), and the round's block G is the one that maximises the expected committed tokens of the whole batch per
modelled second. The seconds are the SPS table's target step at the verify batch plus a fitted affine function of
the rows, their context (the SPS table is profiled on short contexts), and, when anything is drafted, the drafting
rows, G and rows x G (the backbone runs once per round whatever G is; the LM head and the sequential head run per
drafted position), fitted to logged rounds, plain steps included; a plain step is the choice to beat. The
engine drafts one block for the requests that draft (the backbone and the head run on [rows, G]), so G is per round;
which requests draft is per request (the others take a plain step inside the round).

Losslessness: the blocks are chosen before the round is drafted, from committed tokens and past rounds only, so they
cannot depend on the draft tokens they would verify; any choice of block leaves the output distribution the target's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import model_validator

from dspark_core.verification.acceptance_model import AcceptanceModel

if TYPE_CHECKING:
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.verification.sps import SpsTable

# per request and position, in this order; the file names them so a file from another feature set is refused
GAMMA_FEATURES = (
    "bias",  # 1
    "position",  # j / 16
    "recent_acceptance",  # the request's rolling per-position acceptance (accepted / positions seen)
    "repeat",  # share of the last WINDOW tokens that occur in the CONTEXT tokens before them (copyable text)
    "newline",  # share of the last WINDOW tokens whose text holds a line break (line-structured text: code)
    "symbol",  # share of the last WINDOW tokens without a letter or digit (punctuation, operators, indentation)
)
TEXT_FEATURES = GAMMA_FEATURES[3:]  # what `text_features` returns
WINDOW = 32  # recent tokens the text features describe
CONTEXT = 256  # earlier tokens a recent token may repeat
# a round's seconds beyond the SPS table's target step = c . x, x = these terms; rows: requests in the round, k: those
# that draft, G: the block, context: their committed tokens in thousands (attention the SPS table, profiled on short
# contexts, does not price)
COST_TERMS = (
    "round",  # 1
    "row",  # rows
    "context",  # sum of the rows' committed tokens / 1000
    "draft",  # 1 when anything is drafted (the backbone's forward, the drafter's bookkeeping)
    "draft_row",  # k
    "position",  # G when anything is drafted
    "row_position",  # k * G
)


@dataclass(frozen=True)
class TokenClasses:
    """Per token id: whether its text holds a line break, whether it has no letter or digit."""

    newline: frozenset[int]
    symbol: frozenset[int]

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> TokenClasses:
        nl, sym = set(), set()
        for i in range(tok.vocab_size):
            s = tok.tok.id_to_token(i) or ""
            s = s.replace("Ċ", "\n").replace("Ġ", " ")  # byte-level BPE's line break and space
            if "\n" in s:
                nl.add(i)
            if not any(ch.isalnum() for ch in s):
                sym.add(i)
        return cls(frozenset(nl), frozenset(sym))


NO_CLASSES = TokenClasses(frozenset(), frozenset())  # an engine without a tokenizer: class shares read 0


def text_features(tokens: Sequence[int], classes: TokenClasses) -> list[float]:
    """TEXT_FEATURES of a request's committed tokens (prompt included)."""
    recent = tokens[-WINDOW:]
    if not recent:
        return [0.0] * len(TEXT_FEATURES)
    start = len(tokens) - len(recent)
    earlier = set(tokens[max(0, start - CONTEXT): start])
    repeat = sum(t in earlier for t in recent) / len(recent)
    newline = sum(t in classes.newline for t in recent) / len(recent)
    symbol = sum(t in classes.symbol for t in recent) / len(recent)
    return [repeat, newline, symbol]


def cost_row(rows: int, context: float, drafting: int, gamma: int) -> list[float]:
    """COST_TERMS of a round: `rows` requests with `context` committed tokens in all, `drafting` of them drafting up to
    `gamma` tokens (0: a plain step)."""
    on = 1.0 if drafting and gamma else 0.0
    return [1.0, rows, context / 1000.0, on, on * drafting, on * gamma, on * drafting * gamma]


def feature_row(j: int, recent_acceptance: float, text: Sequence[float]) -> list[float]:
    """GAMMA_FEATURES for drafted position j (1-based) of a request."""
    return [1.0, j / 16.0, recent_acceptance, *text]


class GammaPolicyFile(AcceptanceModel):
    """The JSON the bundle ships for `spec.gamma_policy: learned`: the acceptance model plus the round-cost fit."""

    FEATURE_NAMES: ClassVar[tuple[str, ...]] = GAMMA_FEATURES
    LABEL: ClassVar[str] = "learned gamma policy"
    TRAIN_COMMAND: ClassVar[str] = "train-gamma-policy"

    cost_terms: list[str]  # must equal COST_TERMS
    cost: list[float]  # a round's seconds beyond the SPS step = cost . COST_TERMS
    gamma_max: int  # longest block the logs show (the policy never drafts more, nor more than spec.block_size)

    @model_validator(mode="after")
    def _check_cost(self) -> GammaPolicyFile:
        if self.cost_terms != list(COST_TERMS) or len(self.cost) != len(COST_TERMS):
            raise ValueError(f"cost terms must be {list(COST_TERMS)} with one coefficient each")
        if any(not math.isfinite(v) for v in self.cost):
            raise ValueError("cost must be finite")
        if self.gamma_max < 1:
            raise ValueError(f"gamma_max must be >= 1, got {self.gamma_max}")
        return self

    def survival(self, recent_acceptance: float, text: Sequence[float], gamma: int) -> list[float]:
        """Estimated P(positions 1..j all survive) for j = 1..gamma."""
        out, alive = [], 1.0
        for j in range(1, gamma + 1):
            alive *= self.acceptance(feature_row(j, recent_acceptance, text))
            out.append(alive)
        return out

    def extra_seconds(self, rows: int, context: float, drafting: int, gamma: int) -> float:
        """Modelled seconds of a round beyond its SPS step: `rows` requests with `context` committed tokens in all,
        `drafting` of them drafting up to `gamma` tokens (0: a plain step)."""
        return max(0.0, sum(c * t for c, t in zip(self.cost, cost_row(rows, context, drafting, gamma), strict=True)))


def choose_blocks(policy: GammaPolicyFile, sps: SpsTable, survival: Sequence[Sequence[float]],
                  caps: Sequence[int], block: int, context: float = 0.0) -> list[int]:
    """Per request, the tokens to draft this round (0 = none), maximising the batch's expected committed tokens per
    modelled second.

    survival[r][j-1]: P(request r's positions 1..j survive); caps[r]: tokens it may still draft. For each block G in
    1..block the requests are ranked by their expected extra tokens and the best k of them draft min(G, cap) tokens
    (a round commits 1 + sum_{j <= min(G, cap)} survival per drafting request, 1 per other); the round costs the target
    step at the verify batch (verify_all: the scheduler may verify fewer) plus the fitted extra seconds (`context`: the
    rows' committed tokens in all). All zeros (a plain step) is the choice to beat.
    """
    rows = len(survival)
    plan = [0] * rows
    best = rows / (1.0 / sps.lookup(min(rows, sps.max_batch_tokens)) + policy.extra_seconds(rows, context, 0, 0))
    for g in range(1, min(block, policy.gamma_max) + 1):
        lens = [min(g, c) for c in caps]
        gains = [sum(s[:n]) for s, n in zip(survival, lens, strict=True)]
        toks, batch, chosen = float(rows), rows, []
        for r in sorted(range(rows), key=lambda i: -gains[i]):
            if lens[r] == 0:
                break
            toks, batch = toks + gains[r], batch + lens[r]
            chosen.append(r)
            step = 1.0 / sps.lookup(min(batch, sps.max_batch_tokens))
            rate = toks / (step + policy.extra_seconds(rows, context, len(chosen), g))
            if rate > best * (1.0 + 1e-9):
                best, plan = rate, [lens[i] if i in chosen else 0 for i in range(rows)]
    return plan
