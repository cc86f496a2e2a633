"""Lossless verification of a drafted block: greedy matching and rejection sampling.

Greedy: accept draft tokens while they equal the target's argmax; the first mismatch (or the bonus
position after a fully accepted block) contributes the target's argmax.
Sampling (Leviathan et al. / Chen et al.): accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i));
on the first rejection sample from norm(max(0, p_i - q_i)); if all are accepted, sample the bonus token
from p_{n}. With `q = None` the draft is a point mass (n-gram lookup, greedy draft models), so q(x) = 1.
The output is distributed exactly as sampling from p token by token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dspark_core.kernels.spec import use_triton
from dspark_core.kernels.verify import verify as verify_kernel
from dspark_core.modeling.argmax import top1
from dspark_core.verification.sampling import SamplingParams, sampling_probs

if TYPE_CHECKING:
    from dspark_core.modeling.model import ForwardOut


def verify_greedy(target_logits: torch.Tensor, draft: torch.Tensor) -> tuple[int, int]:
    """target_logits [n + 1, V], draft [n] -> (accepted draft tokens k, the target's token after them)."""
    best = top1(target_logits)  # [n + 1]
    n = draft.numel()
    if n:
        miss = (best[:n] != draft).nonzero()
        k = int(miss[0, 0]) if miss.numel() else n
    else:
        k = 0
    return k, int(best[k])


def verify_greedy_batch(target_logits: torch.Tensor, draft: torch.Tensor, num: list[int]) -> list[tuple[int, int]]:
    """target_logits [B, T, V], draft [B, T - 1] (row b valid up to num[b]) -> [(k, token)] per row."""
    t = target_logits.shape[1]
    if t > 1 and use_triton(target_logits):  # one launch, no host sync inside (kernels/verify.py)
        res = verify_kernel(draft[:, : t - 1].to(target_logits.device), target_logits, greedy=True,
                            num_verify=torch.tensor(num, device=target_logits.device))
        return list(zip(res.accept_len.tolist(), res.next_token.tolist(), strict=True))
    return greedy_verdicts(top1(target_logits), draft, num)


def greedy_verdicts(best: torch.Tensor, draft: torch.Tensor, num: list[int]) -> list[tuple[int, int]]:
    """best [B, T] target argmax tokens, draft [B, T - 1] (row b valid up to num[b]) -> [(k, token)] per row."""
    t = best.shape[1]
    if t == 1:
        return [(0, int(x)) for x in best[:, 0].tolist()]
    valid = torch.arange(t - 1)[None, :] < torch.tensor(num)[:, None]  # [B, T-1]
    match = (best[:, : t - 1].cpu() == draft[:, : t - 1].cpu()) & valid
    # k = length of the leading run of matches: cumprod stays 1 while matching
    ks = match.long().cumprod(dim=1).sum(dim=1).tolist()
    best_l = best.cpu().tolist()
    return [(k, best_l[b][k]) for b, k in enumerate(ks)]


def verify_sampling(
    p: torch.Tensor,  # [n + 1, V] target probabilities (after the sampling transform)
    q: torch.Tensor | None,  # [n, V] draft probabilities, or None for a point-mass draft
    draft: torch.Tensor,  # [n] long
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Rejection sampling -> (accepted draft tokens k, the token sampled after them)."""
    n = draft.numel()
    if n:
        idx = torch.arange(n, device=p.device)
        px = p[idx, draft]  # [n]
        qx = q[idx, draft] if q is not None else torch.ones_like(px)
        u = torch.rand(n, generator=generator, device="cpu").to(p.device)
        rejected = (u * qx >= px).nonzero()  # accept iff u < p/q  <=>  u*q < p
        k = int(rejected[0, 0]) if rejected.numel() else n
    else:
        k = 0
    if k < n:
        if q is not None:
            residual = (p[k] - q[k]).clamp_min(0.0)
        else:
            residual = p[k].clone()
            residual[draft[k]] = 0.0
        total = residual.sum()
        dist = residual / total if total > 0 else p[k]
    else:
        dist = p[n]
    token = int(torch.multinomial(dist.float().cpu(), 1, generator=generator))
    return k, token


def round_verdicts(out: ForwardOut, inp: torch.Tensor, nv: list[int], sampling: list[SamplingParams],
                   generators: list[torch.Generator | None], draft_probs: torch.Tensor | None
                   ) -> list[tuple[int, int]]:
    """(accepted drafts, next token) per row of a round's verify forward `out` over `inp` [B, T] (anchor, then nv[b]
    drafts): batched greedy matching when every row is greedy, else row by row (greedy rows by argmax, sampled rows
    by rejection sampling against the drafts' probabilities [B, T - 1, V], None for point-mass drafts)."""
    if all(sp.greedy for sp in sampling):
        if out.pack is not None and not use_triton(out.flat_logits):  # ragged: argmax of real tokens only
            return greedy_verdicts(out.argmax(), inp[:, 1:], nv)
        return verify_greedy_batch(out.logits, inp[:, 1:], nv)
    verdicts = []
    for i, sp in enumerate(sampling):
        logits = out.row_logits(i)[: nv[i] + 1]
        draft = inp[i, 1 : nv[i] + 1].to(logits.device)
        if sp.greedy:
            verdicts.append(verify_greedy(logits, draft))
            continue
        p = sampling_probs(logits, sp)
        q = draft_probs[i, : nv[i]].to(p.device) if draft_probs is not None else None
        verdicts.append(verify_sampling(p, q, draft, generators[i]))
    return verdicts
