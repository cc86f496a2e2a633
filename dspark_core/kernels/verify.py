"""Batched speculative verification over [B, gamma, V] in one launch: greedy and rejection sampling.

Semantics (DESIGN.md section 4), per request b with n_b <= gamma drafted tokens to verify:
- greedy: accept draft token k while it equals argmax of the target at position k; the next token is the
  target's argmax at the first mismatch, or at position n_b (the bonus) when all n_b are accepted.
- sampling: accept x_k with probability min(1, p_k(x_k) / q_k(x_k)), i.e. when u_k * q_k(x_k) < p_k(x_k);
  on the first rejection sample the next token from normalise(max(0, p_k - q_k)); if all are accepted sample
  the bonus from p_{n_b}. p and q are already temperature / top-k / top-p processed probabilities.
  Sampling uses one uniform per request by inverse CDF: the first index whose running mass exceeds u * total.
  If the residual has no mass (p == q in floating point) the token is sampled from p instead.

Randomness comes in as tensors (`u_accept` [B, gamma], `u_sample` [B]) so that the Triton kernel and the
torch reference give the same answer from the same numbers: accept lengths are bit-identical (the same
fp32 comparison on the same gathered values); a resampled token can differ only when u * total falls within
rounding of a cumulative-sum boundary (the two sum in a different order), which leaves the distribution
unchanged.

The Triton kernel runs one program per request in one launch, so no host sync and no [B, gamma+1, V]
intermediate: greedy reads target rows only up to the first mismatch (torch eager reads all gamma + 1
rows), sampling reads one row of p and q for the resample instead of materialising residuals. When B is
too small to fill the GPU, config SPLIT > 1 (or SPLIT = 0, auto) switches to verify_split.py, which splits
the vocabulary over several programs per request in two launches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .registry import KernelEntry
from .spec import KernelSpec, launch, pow2_ceil, resolve_config, use_triton
from .verify_split import auto_split, verify_split

# SPLIT: programs per request over the vocabulary (1 = the one-launch kernel below; >1 = verify_split.py;
# 0 = auto: split only when B is too small to fill the GPU)
_SPACE = {"BLOCK_V": (512, 1024, 2048, 4096, 8192), "num_warps": (2, 4, 8, 16), "num_stages": (1, 2, 3, 4),
          "SPLIT": (0, 1, 2, 4, 8, 16, 32)}
SPEC_GREEDY = KernelSpec(
    name="verify_greedy",
    space={**_SPACE, "ROWS": (1, 2, 4)},  # ROWS: target rows reduced per pass (one-launch kernel only)
    defaults={
        "default": {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 2, "ROWS": 1, "SPLIT": 0},
        "ampere": {"BLOCK_V": 2048, "num_warps": 8, "num_stages": 2, "ROWS": 2, "SPLIT": 0},
        "hopper": {"BLOCK_V": 4096, "num_warps": 8, "num_stages": 3, "ROWS": 2, "SPLIT": 0},
        "blackwell": {"BLOCK_V": 4096, "num_warps": 8, "num_stages": 3, "ROWS": 2, "SPLIT": 0},
    },
    doc="greedy verification: accept while draft == target argmax, then the target's token",
)
SPEC_SAMPLE = KernelSpec(
    name="verify_sample",
    space=_SPACE,
    defaults={
        "default": {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 2, "SPLIT": 0},
        "ampere": {"BLOCK_V": 2048, "num_warps": 8, "num_stages": 2, "SPLIT": 0},
        "hopper": {"BLOCK_V": 4096, "num_warps": 8, "num_stages": 2, "SPLIT": 0},
        "blackwell": {"BLOCK_V": 4096, "num_warps": 8, "num_stages": 2, "SPLIT": 0},
    },
    doc="rejection-sampling verification with residual resampling and bonus token",
)


@dataclass
class VerifyResult:
    """Outcome of one verification round for B requests."""

    accept_len: torch.Tensor  # [B] int32, accepted draft tokens (0..n_b)
    next_token: torch.Tensor  # [B] int64, corrected token (first rejection) or bonus token
    tokens: torch.Tensor  # [B, gamma+1] int64, accepted drafts then next_token, -1 after


def shape_bucket(shape: Mapping[str, int]) -> str:
    """Bucket key for tuned configs: batch and vocab rounded up to powers of two, gamma exact."""
    return f"B{pow2_ceil(shape['batch'])}-g{shape['gamma']}-V{pow2_ceil(shape['vocab'])}"


def verify(draft: torch.Tensor, target: torch.Tensor, *, greedy: bool,
           draft_probs: torch.Tensor | None = None, u_accept: torch.Tensor | None = None,
           u_sample: torch.Tensor | None = None, num_verify: torch.Tensor | None = None,
           backend: str | None = None, config: Mapping[str, int] | None = None) -> VerifyResult:
    """Verify drafted tokens; dispatches to Triton (CUDA, or forced) or the torch reference.

    draft [B, G] int64 drafted tokens; target [B, G+1, V]: logits (greedy) or probabilities (sampling);
    draft_probs [B, G, V] the draft's probabilities (sampling); u_accept [B, G] and u_sample [B] uniforms in
    [0, 1) (sampling); num_verify [B] tokens each request verifies (default G, the scheduler may cut it).
    """
    _check(draft, target, greedy, draft_probs, u_accept, u_sample, num_verify)
    if use_triton(draft, backend):
        return verify_triton(draft, target, greedy=greedy, draft_probs=draft_probs, u_accept=u_accept,
                             u_sample=u_sample, num_verify=num_verify, config=config)
    return verify_torch(draft, target, greedy=greedy, draft_probs=draft_probs, u_accept=u_accept,
                        u_sample=u_sample, num_verify=num_verify)


def _check(draft: torch.Tensor, target: torch.Tensor, greedy: bool, draft_probs: torch.Tensor | None,
           u_accept: torch.Tensor | None, u_sample: torch.Tensor | None,
           num_verify: torch.Tensor | None) -> None:
    if draft.dim() != 2 or target.dim() != 3:
        raise ValueError(f"verify: draft must be [B, G] and target [B, G+1, V], got {tuple(draft.shape)} "
                         f"and {tuple(target.shape)}")
    b, g = draft.shape
    if g < 1 or target.shape[:2] != (b, g + 1):
        raise ValueError(f"verify: target {tuple(target.shape)} does not match draft {tuple(draft.shape)}")
    if not greedy:
        v = target.shape[2]
        if draft_probs is None or u_accept is None or u_sample is None:
            raise ValueError("verify: sampling needs draft_probs, u_accept and u_sample")
        if tuple(draft_probs.shape) != (b, g, v) or tuple(u_accept.shape) != (b, g) \
                or tuple(u_sample.shape) != (b,):
            raise ValueError("verify: draft_probs must be [B, G, V], u_accept [B, G], u_sample [B]")
    if num_verify is not None and tuple(num_verify.shape) != (b,):
        raise ValueError(f"verify: num_verify must be [B]={b}, got {tuple(num_verify.shape)}")


def _assemble(draft: torch.Tensor, acc: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
    b, g = draft.shape
    pos = torch.arange(g + 1, device=draft.device)  # [G+1]
    padded = torch.cat([draft, draft.new_full((b, 1), -1)], dim=1)  # [B, G+1]
    out = torch.where(pos[None] < acc[:, None], padded, torch.full_like(padded, -1))
    return torch.where(pos[None] == acc[:, None], nxt[:, None], out)


def verify_torch(draft: torch.Tensor, target: torch.Tensor, *, greedy: bool,
                 draft_probs: torch.Tensor | None = None, u_accept: torch.Tensor | None = None,
                 u_sample: torch.Tensor | None = None,
                 num_verify: torch.Tensor | None = None) -> VerifyResult:
    """Reference implementation: vectorised torch, no Python loop over requests or positions."""
    b, g = draft.shape
    v = target.shape[2]
    dev = draft.device
    num = num_verify.to(dev, torch.int64) if num_verify is not None else torch.full((b,), g, device=dev)
    valid = torch.arange(g, device=dev)[None] < num[:, None]  # [B, G]
    rows = torch.arange(b, device=dev)
    if greedy:
        am = target.argmax(dim=-1)  # [B, G+1], first index on ties
        ok = (am[:, :g] == draft) & valid
        acc = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
        nxt = am[rows, acc]
        return VerifyResult(acc.to(torch.int32), nxt, _assemble(draft, acc, nxt))
    assert draft_probs is not None and u_accept is not None and u_sample is not None
    idx = draft.unsqueeze(-1)  # [B, G, 1]
    px = target[:, :g].gather(-1, idx).squeeze(-1).float()  # [B, G]
    qx = draft_probs.gather(-1, idx).squeeze(-1).float()  # [B, G]
    ok = (u_accept.float() * qx < px) & valid
    acc = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    p_row = target[rows, acc].float()  # [B, V]
    rej = acc < num  # [B]
    q_row = draft_probs[rows, acc.clamp(max=g - 1)].float() * rej[:, None]  # [B, V]
    resid = (p_row - q_row).clamp_min(0.0)  # [B, V]
    tot_r = resid.sum(dim=1)  # [B]
    use_q = rej & (tot_r > 0)
    w = torch.where(use_q[:, None], resid, p_row.clamp_min(0.0))  # [B, V]
    total = torch.where(use_q, tot_r, p_row.clamp_min(0.0).sum(dim=1))  # [B]
    cdf = w.cumsum(dim=1)  # [B, V]
    thresh = u_sample.float() * total  # [B]
    tok = torch.searchsorted(cdf, thresh[:, None].contiguous(), right=True).squeeze(1)  # [B], V if none
    pos = torch.arange(v, device=dev)
    last_pos = torch.where(w > 0, pos[None], torch.full_like(pos[None], -1)).amax(dim=1).clamp_min(0)
    nxt = torch.where(tok < v, tok, last_pos)
    return VerifyResult(acc.to(torch.int32), nxt, _assemble(draft, acc, nxt))


@triton.jit
def _verify_kernel(
    draft_ptr,  # [B, G] int64
    num_ptr,  # [B] int32, tokens to verify per request
    tgt_ptr,  # [B, G+1, V] logits (greedy) or probabilities (sampling), last dim contiguous
    q_ptr,  # [B, G, V] draft probabilities (sampling; unused for greedy)
    ua_ptr,  # [B, G] fp32 acceptance uniforms (sampling)
    us_ptr,  # [B] fp32 resampling uniforms (sampling)
    acc_ptr,  # [B] int32 out: accepted lengths
    next_ptr,  # [B] int64 out: corrected / bonus token
    out_ptr,  # [B, G+1] int64 out: accepted drafts, next token, then -1
    G, V,
    s_db, s_tb, s_tk, s_qb, s_qk, s_ub,
    GREEDY: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_G: tl.constexpr, ROWS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(num_ptr + b)
    cols = tl.arange(0, BLOCK_V)
    k = n * 0  # accepted so far (int32 scalar)
    go = n >= 0  # loop flag (true)
    nxt = (n * 0).to(tl.int64)
    if GREEDY:
        # ROWS target rows per pass over the vocabulary: more loads in flight per program, at the cost of
        # reading at most ROWS - 1 rows past the first mismatch
        ri = tl.arange(0, ROWS)
        while go:
            rk = k + ri  # [ROWS] row indices; row n is the bonus row, rows past it are not read
            live = rk <= n
            rows = tgt_ptr + b * s_tb + rk.to(tl.int64) * s_tk  # [ROWS] row pointers
            best_v = tl.full([ROWS], float("-inf"), tl.float32)
            best_i = tl.zeros([ROWS], tl.int64)
            for off in range(0, V, BLOCK_V):
                idx = off + cols
                x = tl.load(rows[:, None] + idx[None, :], mask=live[:, None] & (idx < V)[None, :],
                            other=float("-inf")).to(tl.float32)  # [ROWS, BLOCK_V]
                bm = tl.max(x, 1)
                bi = tl.argmax(x, 1).to(tl.int64) + off  # first index on ties within the block
                upd = bm > best_v  # strict: an earlier block keeps a tie
                best_i = tl.where(upd, bi, best_i)
                best_v = tl.where(upd, bm, best_v)
            d = tl.load(draft_ptr + b * s_db + rk, mask=rk < n, other=-1)  # [ROWS]
            ok = (rk < n) & (best_i == d)
            first_bad = tl.min(tl.where(ok, ROWS, ri), 0)  # accepted rows at the front of this group
            k += first_bad
            nxt = tl.sum(tl.where(ri == first_bad, best_i, 0), 0)  # correction, or bonus at row n
            go = first_bad == ROWS
    else:
        while go:
            valid = k < n
            d = tl.load(draft_ptr + b * s_db + k, mask=valid, other=0)
            px = tl.load(tgt_ptr + b * s_tb + k.to(tl.int64) * s_tk + d, mask=valid, other=0.0).to(tl.float32)
            qx = tl.load(q_ptr + b * s_qb + k.to(tl.int64) * s_qk + d, mask=valid, other=1.0).to(tl.float32)
            u = tl.load(ua_ptr + b * s_ub + k, mask=valid, other=1.0).to(tl.float32)
            ok = valid & (u * qx < px)
            k += ok.to(tl.int32)
            go = ok
        rej = k < n
        rej_f = rej.to(tl.float32)  # 1.0: residual of the first rejection; 0.0: bonus from p
        prow = tgt_ptr + b * s_tb + k.to(tl.int64) * s_tk
        qrow = q_ptr + b * s_qb + tl.minimum(k, G - 1).to(tl.int64) * s_qk
        # pass 1: residual mass and (fallback) p mass
        tot_r = tl.zeros([], tl.float32)
        tot_p = tl.zeros([], tl.float32)
        for off in range(0, V, BLOCK_V):
            idx = off + cols
            inb = idx < V
            p = tl.maximum(tl.load(prow + idx, mask=inb, other=0.0).to(tl.float32), 0.0)
            q = tl.load(qrow + idx, mask=inb, other=0.0).to(tl.float32) * rej_f
            tot_r += tl.sum(tl.maximum(p - q, 0.0), 0)
            tot_p += tl.sum(p, 0)
        use_q = rej & (tot_r > 0.0)
        total = tl.where(use_q, tot_r, tot_p)
        use_q_f = use_q.to(tl.float32)
        thresh = tl.load(us_ptr + b).to(tl.float32) * total
        # pass 2: inverse CDF, stops at the block holding the crossing
        run = tl.zeros([], tl.float32)
        found = n < 0  # false
        tok = (n * 0).to(tl.int64)
        last_pos = (n * 0).to(tl.int64)
        off2 = (n * 0).to(tl.int64)
        while (off2 < V) & (found == 0):
            idx = off2 + cols
            inb = idx < V
            p = tl.maximum(tl.load(prow + idx, mask=inb, other=0.0).to(tl.float32), 0.0)
            q = tl.load(qrow + idx, mask=inb, other=0.0).to(tl.float32) * use_q_f
            w = tl.maximum(p - q, 0.0)
            c = tl.cumsum(w, 0) + run
            first = tl.min(tl.where((c > thresh) & inb, idx, V), 0)
            last_pos = tl.maximum(last_pos, tl.max(tl.where((w > 0.0) & inb, idx, -1), 0))
            found = first < V
            tok = tl.where(found, first, tok)
            run = tl.max(c, 0)
            off2 += BLOCK_V
        nxt = tl.where(found, tok, last_pos)
    tl.store(acc_ptr + b, k)
    tl.store(next_ptr + b, nxt)
    gi = tl.arange(0, BLOCK_G)
    dk = tl.load(draft_ptr + b * s_db + gi, mask=(gi < k) & (gi < G), other=-1)
    o = tl.where(gi < k, dk, tl.where(gi == k, nxt, -1))
    tl.store(out_ptr + b * (G + 1) + gi, o, mask=gi < G + 1)


def verify_triton(draft: torch.Tensor, target: torch.Tensor, *, greedy: bool,
                  draft_probs: torch.Tensor | None = None, u_accept: torch.Tensor | None = None,
                  u_sample: torch.Tensor | None = None, num_verify: torch.Tensor | None = None,
                  config: Mapping[str, int] | None = None) -> VerifyResult:
    """SPLIT = 1: one launch, grid (B,), one program per request; SPLIT > 1 (or 0 = auto and B small):
    verify_split's two launches with the vocabulary split over SPLIT programs per request."""
    b, g = draft.shape
    v = target.shape[2]
    spec = SPEC_GREEDY if greedy else SPEC_SAMPLE
    cfg = resolve_config(spec, shape_bucket({"batch": b, "gamma": g, "vocab": v}), draft.device, config)
    dev = draft.device
    if target.stride(-1) != 1:
        target = target.contiguous()
    num = (num_verify.to(dev, torch.int32).clamp(0, g) if num_verify is not None
           else torch.full((b,), g, device=dev, dtype=torch.int32))
    if greedy:
        q, ua, us = target, draft, draft  # placeholders, never read
        s_qb = s_qk = s_ub = 0
    else:
        assert draft_probs is not None and u_accept is not None and u_sample is not None
        q = draft_probs if draft_probs.stride(-1) == 1 else draft_probs.contiguous()
        ua = u_accept.float()
        us = u_sample.float().contiguous()
        s_qb, s_qk, s_ub = q.stride(0), q.stride(1), ua.stride(0)
    split = cfg["SPLIT"] if cfg["SPLIT"] > 0 else auto_split(b, v, cfg["BLOCK_V"], dev)
    if split > 1:
        acc, nxt, out = verify_split(draft, num, target, q, ua, us, (s_qb, s_qk, s_ub), greedy=greedy,
                                     split=split, block_v=cfg["BLOCK_V"], num_warps=cfg["num_warps"],
                                     num_stages=cfg["num_stages"])
        return VerifyResult(acc, nxt, out)
    acc = torch.empty(b, device=dev, dtype=torch.int32)
    nxt = torch.empty(b, device=dev, dtype=torch.int64)
    out = torch.empty(b, g + 1, device=dev, dtype=torch.int64)
    launch(_verify_kernel, (b,), draft, num, target, q, ua, us, acc, nxt, out, g, v,
           draft.stride(0), target.stride(0), target.stride(1), s_qb, s_qk, s_ub,
           on_cpu=not draft.is_cuda, GREEDY=greedy, BLOCK_V=cfg["BLOCK_V"], BLOCK_G=pow2_ceil(g + 1),
           ROWS=cfg.get("ROWS", 1),
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return VerifyResult(acc, nxt, out)


def make_inputs(shape: Mapping[str, int], device: torch.device | str, seed: int,
                greedy: bool, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Random round for tests and tuning: drafts agree with the target for a random prefix per request.

    shape: batch, gamma, vocab. Greedy: target logits; sampling: softmax probabilities (q from a perturbed
    target so acceptance is realistic, neither always nor never).
    """
    b, g, v = shape["batch"], shape["gamma"], shape["vocab"]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(b, g + 1, v, generator=gen) * 3.0  # [B, G+1, V]
    agree = torch.randint(0, g + 1, (b,), generator=gen)  # [B] prefix that matches
    if greedy:
        am = logits.argmax(-1)[:, :g]  # [B, G]
        other = torch.randint(0, v, (b, g), generator=gen)
        pos = torch.arange(g)[None]
        draft = torch.where(pos < agree[:, None], am, other)
        return {"draft": draft.to(device), "target": logits.to(device=device, dtype=dtype), "greedy": True}
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(logits[:, :g] + torch.randn(b, g, v, generator=gen) * 1.5, dim=-1)  # [B, G, V]
    draft = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, g)
    return {"draft": draft.to(device), "target": p.to(device=device, dtype=dtype),
            "draft_probs": q.to(device=device, dtype=dtype),
            "u_accept": torch.rand(b, g, generator=gen).to(device),
            "u_sample": torch.rand(b, generator=gen).to(device), "greedy": False}


def _check_greedy(out: VerifyResult, ref: VerifyResult, _inputs: dict[str, Any]) -> None:
    assert torch.equal(out.accept_len.cpu(), ref.accept_len.cpu()), "greedy accept lengths differ"
    assert torch.equal(out.tokens.cpu(), ref.tokens.cpu()), "greedy tokens differ"


def _check_sample(out: VerifyResult, ref: VerifyResult, inputs: dict[str, Any]) -> None:
    """Accept lengths equal; a resampled token may differ from the reference only where the inverse CDF is
    ambiguous in fp32: the uniform's threshold sits within rounding of the boundary between the two tokens
    (the kernel sums the running mass block by block, torch's cumsum in another order; over a 152k vocabulary
    that moves a boundary by ~1e-5 of the mass). Each differing token must hold the threshold in its fp64 CDF
    interval widened by `tol` of the total mass, and have positive weight."""
    assert torch.equal(out.accept_len.cpu(), ref.accept_len.cpu()), "sampling accept lengths differ"
    bad = (out.next_token.cpu() != ref.next_token.cpu()).nonzero().flatten().tolist()
    if not bad:
        return
    tol = 1e-4
    p, q = inputs["target"].cpu().double(), inputs["draft_probs"].cpu().double()  # [B, G+1, V], [B, G, V]
    g, acc = q.shape[1], ref.accept_len.cpu().long()
    for r in bad:
        a = int(acc[r])
        w = p[r, a].clamp_min(0.0)
        if a < g and (resid := (w - q[r, a]).clamp_min(0.0)).sum() > 0:  # rejected: the residual distribution
            w = resid
        cdf = w.cumsum(0)
        thresh, k = float(inputs["u_sample"][r]) * float(cdf[-1]), int(out.next_token[r])
        lo = float(cdf[k - 1]) if k > 0 else 0.0
        ok = w[k] > 0 and lo - tol * float(cdf[-1]) <= thresh <= float(cdf[k]) + tol * float(cdf[-1])
        assert ok, (f"sampling: request {r} resampled token {k}, but the threshold {thresh:.6g} lies outside its "
                    f"CDF interval [{lo:.6g}, {float(cdf[k]):.6g}] (reference token {int(ref.next_token[r])})")


def _bytes(shape: Mapping[str, int], greedy: bool) -> int:
    b, g, v = shape["batch"], shape["gamma"], shape["vocab"]
    return b * (g + 1) * v * 4 if greedy else 2 * b * v * 4  # greedy: every logit row; sampling: p, q rows


def _run_triton(inputs: dict[str, Any], config: Mapping[str, int] | None) -> VerifyResult:
    return verify(**inputs, backend="triton", config=config)


def _run_torch(inputs: dict[str, Any]) -> VerifyResult:
    return verify(**inputs, backend="torch")


ENTRY_GREEDY = KernelEntry(
    spec=SPEC_GREEDY, shape_keys=("batch", "gamma", "vocab"), bucket=shape_bucket,
    make_inputs=lambda shape, device, seed: make_inputs(shape, device, seed, greedy=True),
    run_triton=_run_triton, run_torch=_run_torch, check=_check_greedy,
    bytes_moved=lambda shape: _bytes(shape, True))
ENTRY_SAMPLE = KernelEntry(
    spec=SPEC_SAMPLE, shape_keys=("batch", "gamma", "vocab"), bucket=shape_bucket,
    make_inputs=lambda shape, device, seed: make_inputs(shape, device, seed, greedy=False),
    run_triton=_run_triton, run_torch=_run_torch, check=_check_sample,
    bytes_moved=lambda shape: _bytes(shape, False))
