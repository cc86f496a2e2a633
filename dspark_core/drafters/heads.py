"""Sequential heads of the DSpark drafter and its confidence head (DSpark paper, sections 3.1 and 3.2.1).

The parallel backbone gives base logits U_k and hidden states h_k for all block positions at once; a
sequential head adds a prefix-dependent bias B_k, sampled left to right: p_k(v) ~ exp(U_k(v) + B_k(v)).

- Markov head: B_k = W1[x_{k-1}] @ W2, W1 in R^{V x r}, W2 in R^{r x V} (a rank-r bigram bias).
- RNN head: z = [s_{k-1}; W1[x_{k-1}]; h_k]; one linear map of z gives gate g, candidate c and output o;
  s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c); B_k = tanh(o) @ W2; s_0 = 0.
- none: B_k = 0, the plain DFlash-style parallel drafter (the ablation).

W1 (the "Markov embedding") also feeds the confidence head c_k = sigmoid(w . [h_k; W1[x_{k-1}]]), so every
head kind owns a W1, including `none` (there it serves only the confidence head).
Each head exposes one `step` (used left to right at inference, and teacher-forced in training).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

if TYPE_CHECKING:
    from dspark_core.drafters.draft_vocab import Columns

HeadKind = Literal["none", "markov", "rnn"]
HEADS: tuple[str, ...] = ("none", "markov", "rnn")


class SequentialHead(nn.Module):
    """Markov embedding W1 plus, for markov / rnn, the bias of Eq. (5) / Eq. (6)."""

    def __init__(self, kind: HeadKind, vocab_size: int, hidden_size: int, rank: int) -> None:
        super().__init__()
        if kind not in HEADS:
            raise ValueError(f"unknown head {kind!r}; choose one of {', '.join(HEADS)}")
        self.kind = kind
        self.rank = rank
        self.w1 = nn.Embedding(vocab_size, rank)  # W1 [V, r]: Markov embedding of the previous token
        nn.init.normal_(self.w1.weight, std=0.02)
        self.w2: nn.Linear | None = None  # W2 [r, V] (stored as Linear(r -> V) without bias)
        self.rnn: nn.Linear | None = None  # [W_g; W_c; W_o]: (2r + d) -> 3r
        if kind in ("markov", "rnn"):
            self.w2 = nn.Linear(rank, vocab_size, bias=False)
            nn.init.zeros_(self.w2.weight)  # start as the parallel drafter: B = 0
        if kind == "rnn":
            self.rnn = nn.Linear(2 * rank + hidden_size, 3 * rank)
            nn.init.normal_(self.rnn.weight, std=0.02)
            nn.init.zeros_(self.rnn.bias)

    def init_state(self, batch: int, like: torch.Tensor) -> torch.Tensor | None:
        """s_0 = 0 for the RNN head ([B, r]); None otherwise."""
        if self.kind != "rnn":
            return None
        return torch.zeros(batch, self.rank, dtype=like.dtype, device=like.device)

    def embed_prev(self, prev: torch.Tensor) -> torch.Tensor:
        """W1[x_{k-1}]: prev [...] long -> [..., r]."""
        return self.w1(prev)

    def step(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None, cols: Columns | None = None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """One position: prev [B] long, h [B, d] -> (bias [B, V] or None for `none`, new state, W1[prev] [B, r]);
        with `cols` (a reduced draft vocabulary) the bias is [B, M] over its columns."""
        e = self.w1(prev)  # [B, r]
        if self.kind == "none":
            return None, state, e
        assert self.w2 is not None
        w2 = self.w2 if cols is None else cols.bias
        if self.kind == "markov":
            return w2(e), state, e
        assert state is not None
        new_state, out = self._rnn_update(state, e, h)
        return w2(torch.tanh(out)), new_state, e

    def _rnn_update(self, state: torch.Tensor, e: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z = [s_{k-1}; W1[x_{k-1}]; h_k] -> (s_k, output pre-activation W_o z), all [B, r]."""
        assert self.rnn is not None
        gate, cand, out = self.rnn(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)  # 3 x [B, r]
        g = torch.sigmoid(gate)
        return g * state + (1.0 - g) * torch.tanh(cand), out

    def teacher_forced(self, prev: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """All positions with given previous tokens (training).

        prev [N, G] long (x_0 = anchor, x_1..x_{G-1} ground truth), h [N, G, d] ->
        (bias [N, G, V] or None, W1[prev] [N, G, r]). Markov is one batched matmul; RNN loops over G.
        """
        e = self.w1(prev)  # [N, G, r]
        if self.kind == "none":
            return None, e
        assert self.w2 is not None
        if self.kind == "markov":
            return self.w2(e), e
        assert self.rnn is not None
        state = self.init_state(prev.shape[0], h)
        outs = []
        for k in range(prev.shape[1]):  # the recurrence is [N, r]-sized; W2 runs once on all positions below
            state, out = self._rnn_update(state, e[:, k], h[:, k])  # type: ignore[arg-type]
            outs.append(out)
        return self.w2(torch.tanh(torch.stack(outs, dim=1))), e


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w . [h_k; W1[x_{k-1}]]); returns the raw logit (STS divides it by T_k)."""

    def __init__(self, hidden_size: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.constant_(self.proj.bias, 1.0)  # start mildly confident

    def forward(self, h: torch.Tensor, e_prev: torch.Tensor) -> torch.Tensor:
        """h [..., d], e_prev [..., r] -> raw logit [...]."""
        return self.proj(torch.cat([h, e_prev], dim=-1)).squeeze(-1)
