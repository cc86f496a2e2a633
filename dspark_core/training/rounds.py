"""Offline greedy rounds: what the engine would see at many anchors, computed in batches without it.

On target-generated *greedy* sequences the target's token after any prefix of the sequence is the next
sequence token, so a greedy speculative round at anchor p is fully determined offline: draft the block
left to right (the real sampling path, with the drafted tokens feeding the sequential and confidence
heads), then accept while the draft equals the target's argmax. One packed backbone forward serves many
anchors. The rounds feed STS calibration (raw confidence logits vs observed prefix survival) and the
acceptance figures (per-position conditional acceptance; tau against gamma, since drafting gamma tokens
is the first gamma of the trained block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dspark_core.verification.sampling import SamplingParams

if TYPE_CHECKING:
    from dspark_core.drafters.dspark import DSparkDraftModel
    from dspark_core.modeling.model import LeanModel


@dataclass
class Rounds:
    """Simulated verify-all greedy rounds at random anchors."""

    confidence_logits: torch.Tensor  # [M, G] raw confidence-head logits
    accepted: torch.Tensor  # [M] long: draft tokens accepted out of the full block of G

    @property
    def gamma(self) -> int:
        return int(self.confidence_logits.shape[1])

    def position_acceptance(self) -> list[float]:
        """P(token k accepted | tokens < k accepted), k = 1..G (the paper's Figure 2)."""
        out = []
        for k in range(1, self.gamma + 1):
            reached = int((self.accepted >= k - 1).sum())
            out.append(float((self.accepted >= k).sum()) / reached if reached else 0.0)
        return out

    def tau(self, gamma: int) -> float:
        """Expected tokens per round when drafting and verifying `gamma` tokens (bonus included)."""
        return 1.0 + float(self.accepted.clamp(max=gamma).float().mean())


@torch.no_grad()
def simulate_greedy_rounds(model: DSparkDraftModel, target: LeanModel, tokens: torch.Tensor, prompt_len: int, *,
                           anchors_per_seq: int = 8, seed: int = 0, batch: int = 16) -> Rounds:
    """Rounds at `anchors_per_seq` random anchors per row of `tokens` [S, T] (greedy continuations)."""
    g = model.cfg.block_size
    gen = torch.Generator().manual_seed(seed)
    n, t = tokens.shape
    lo, hi = max(1, prompt_len - 1), t - 1 - g
    if hi < lo:
        raise ValueError(f"sequences of {t} tokens are too short for blocks of {g} after {prompt_len} prompt tokens")
    confs, accs = [], []
    greedy = SamplingParams()
    for start in range(0, n, batch):
        rows = tokens[start:start + batch].to(target.device)
        b = rows.shape[0]
        t_logits, hidden = target.forward_full(rows, hidden_layers=tuple(model.cfg.target_layers))
        best = t_logits.argmax(-1)  # [b, T]: target's greedy token after each prefix
        anchors = torch.randint(lo, hi + 1, (b, anchors_per_seq), generator=gen).to(target.device)
        block = model.forward_packed(rows, hidden, anchors)
        flat = type(block)(block.base_logits.reshape(b * anchors_per_seq, g, -1),
                           block.hidden.reshape(b * anchors_per_seq, g, -1))
        out = model.draft(flat, rows.gather(1, anchors).reshape(-1), [greedy] * (b * anchors_per_seq))
        idx = anchors[:, :, None] + torch.arange(g, device=rows.device)[None, None]  # positions p .. p+G-1
        want = best.gather(1, idx.reshape(b, -1)).view(b * anchors_per_seq, g)
        on_path = (rows.gather(1, (idx + 1).reshape(b, -1)) == best.gather(1, idx.reshape(b, -1)))
        match = (out.tokens == want) & on_path.view(b * anchors_per_seq, g)
        accs.append(match.long().cumprod(dim=1).sum(dim=1).cpu())
        confs.append(out.confidence_logits.float().cpu())
    return Rounds(confidence_logits=torch.cat(confs), accepted=torch.cat(accs))
