"""Verification for small batches: the vocabulary split over SPLIT programs per request, two launches.

Why: the one-launch kernel in verify.py runs one program per request, so with B requests only B SMs
work; at B = 1..16 on a 132-SM GPU most of the chip idles and torch eager (whole-GPU argmax) wins. Here a
grid (B, SPLIT) reduces slices of the vocabulary in parallel into a small workspace, then a grid (B,)
finalises each request from the partials. Still no host sync; the price is a second launch and, for
greedy, reading every target row (no early exit - a slice cannot know the global argmax of the row).
Cross-program synchronisation inside one launch (atomics + a last-program epilogue) was left out on
purpose: its memory-ordering correctness cannot be tested without a GPU.

Semantics are those of verify.py (same accept lengths from the same randoms; sampling scans the slice
that holds the inverse-CDF crossing, found from the per-slice masses). The tuner chooses SPLIT per
shape bucket; SPLIT = 0 means "auto": enough programs to cover the GPU's SMs when B is small.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .spec import cdiv, launch, pow2_ceil


@triton.jit
def _accepted(draft_ptr, tgt_ptr, q_ptr, ua_ptr, b, n, s_db, s_tb, s_tk, s_qb, s_qk, s_ub):
    """Sampling accept count for request b: leading k with u_k * q_k(x_k) < p_k(x_k), k < n."""
    k = n * 0
    go = n >= 0
    while go:
        valid = k < n
        d = tl.load(draft_ptr + b * s_db + k, mask=valid, other=0)
        px = tl.load(tgt_ptr + b * s_tb + k.to(tl.int64) * s_tk + d, mask=valid, other=0.0).to(tl.float32)
        qx = tl.load(q_ptr + b * s_qb + k.to(tl.int64) * s_qk + d, mask=valid, other=1.0).to(tl.float32)
        u = tl.load(ua_ptr + b * s_ub + k, mask=valid, other=1.0).to(tl.float32)
        ok = valid & (u * qx < px)
        k += ok.to(tl.int32)
        go = ok
    return k


@triton.jit
def _write_out(draft_ptr, acc_ptr, next_ptr, out_ptr, b, k, nxt, G, s_db, BLOCK_G: tl.constexpr):
    tl.store(acc_ptr + b, k)
    tl.store(next_ptr + b, nxt)
    gi = tl.arange(0, BLOCK_G)
    dk = tl.load(draft_ptr + b * s_db + gi, mask=(gi < k) & (gi < G), other=-1)
    o = tl.where(gi < k, dk, tl.where(gi == k, nxt, -1))
    tl.store(out_ptr + b * (G + 1) + gi, o, mask=gi < G + 1)


@triton.jit
def _partial_kernel(
    draft_ptr, num_ptr, tgt_ptr, q_ptr, ua_ptr,  # as in verify._verify_kernel
    pv_ptr, pi_ptr,  # greedy: [B, G+1, S] slice max / argmax; sampling: [B, S] residual / p mass
    G, V, S, CHUNK,
    s_db, s_tb, s_tk, s_qb, s_qk, s_ub,
    GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    n = tl.load(num_ptr + b)
    cols = tl.arange(0, BLOCK_V)
    start = s.to(tl.int64) * CHUNK
    if GREEDY:
        for k in range(0, n + 1):  # every row up to the bonus row
            row = tgt_ptr + b * s_tb + k * s_tk
            best_v = tl.full([], float("-inf"), tl.float32)
            best_i = tl.zeros([], tl.int64)
            for off in range(0, CHUNK, BLOCK_V):
                idx = start + off + cols
                x = tl.load(row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
                bm = tl.max(x, 0)
                bi = tl.argmax(x, 0).to(tl.int64) + start + off
                upd = bm > best_v
                best_i = tl.where(upd, bi, best_i)
                best_v = tl.where(upd, bm, best_v)
            slot = (b * (G + 1) + k) * S + s
            tl.store(pv_ptr + slot, best_v)
            tl.store(pi_ptr + slot, best_i)
    else:
        k = _accepted(draft_ptr, tgt_ptr, q_ptr, ua_ptr, b, n, s_db, s_tb, s_tk, s_qb, s_qk, s_ub)
        rej_f = (k < n).to(tl.float32)
        prow = tgt_ptr + b * s_tb + k.to(tl.int64) * s_tk
        qrow = q_ptr + b * s_qb + tl.minimum(k, G - 1).to(tl.int64) * s_qk
        tot_r = tl.zeros([], tl.float32)
        tot_p = tl.zeros([], tl.float32)
        for off in range(0, CHUNK, BLOCK_V):
            idx = start + off + cols
            inb = idx < V
            p = tl.maximum(tl.load(prow + idx, mask=inb, other=0.0).to(tl.float32), 0.0)
            q = tl.load(qrow + idx, mask=inb, other=0.0).to(tl.float32) * rej_f
            tot_r += tl.sum(tl.maximum(p - q, 0.0), 0)
            tot_p += tl.sum(p, 0)
        tl.store(pv_ptr + b * S + s, tot_r)
        tl.store(pi_ptr + b * S + s, tot_p)


@triton.jit
def _finalize_kernel(
    draft_ptr, num_ptr, tgt_ptr, q_ptr, ua_ptr, us_ptr,
    pv_ptr, pi_ptr, acc_ptr, next_ptr, out_ptr,
    G, V, S, CHUNK,
    s_db, s_tb, s_tk, s_qb, s_qk, s_ub,
    GREEDY: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(num_ptr + b)
    si = tl.arange(0, BLOCK_S)
    smask = si < S
    if GREEDY:
        k = n * 0
        nxt = tl.zeros([], tl.int64)
        go = n >= 0
        while go:
            slot = (b * (G + 1) + k) * S + si
            pv = tl.load(pv_ptr + slot, mask=smask, other=float("-inf"))
            pi = tl.load(pi_ptr + slot, mask=smask, other=0)
            first = tl.argmax(pv, 0)  # first slice holding the max = lowest vocabulary index
            am = tl.sum(tl.where(si == first, pi, 0), 0)
            d = tl.load(draft_ptr + b * s_db + k, mask=k < n, other=-1)
            ok = (k < n) & (am == d)
            k += ok.to(tl.int32)
            nxt = am
            go = ok
    else:
        k = _accepted(draft_ptr, tgt_ptr, q_ptr, ua_ptr, b, n, s_db, s_tb, s_tk, s_qb, s_qk, s_ub)
        rej = k < n
        mass_r = tl.load(pv_ptr + b * S + si, mask=smask, other=0.0)
        mass_p = tl.load(pi_ptr + b * S + si, mask=smask, other=0.0)
        tot_r = tl.sum(mass_r, 0)
        use_q = rej & (tot_r > 0.0)
        use_q_f = use_q.to(tl.float32)
        w_s = mass_r * use_q_f + mass_p * (1.0 - use_q_f)  # [BLOCK_S] mass per slice
        total = tl.sum(w_s, 0)
        thresh = tl.load(us_ptr + b).to(tl.float32) * total
        c_s = tl.cumsum(w_s, 0)
        hit = smask & (c_s > thresh)
        sc_hit = tl.min(tl.where(hit, si, BLOCK_S), 0)
        sc_last = tl.max(tl.where(smask & (w_s > 0.0), si, 0), 0)  # rounding fallback: last slice with mass
        sc = tl.where(sc_hit < BLOCK_S, sc_hit, sc_last)
        run = tl.sum(tl.where(si < sc, w_s, 0.0), 0)  # mass before slice sc
        prow = tgt_ptr + b * s_tb + k.to(tl.int64) * s_tk
        qrow = q_ptr + b * s_qb + tl.minimum(k, G - 1).to(tl.int64) * s_qk
        cols = tl.arange(0, BLOCK_V)
        start = sc.to(tl.int64) * CHUNK
        found = n < 0
        tok = tl.zeros([], tl.int64)
        last_pos = tl.zeros([], tl.int64)
        off = tl.zeros([], tl.int64)
        while (off < CHUNK) & (found == 0):
            idx = start + off + cols
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
            off += BLOCK_V
        nxt = tl.where(found, tok, last_pos)
    _write_out(draft_ptr, acc_ptr, next_ptr, out_ptr, b, k, nxt, G, s_db, BLOCK_G)


_SMS: dict[int, int] = {}


def auto_split(batch: int, vocab: int, block_v: int, device: torch.device) -> int:
    """SPLIT = 0 resolved: enough programs to cover the SMs (about 2 per SM) when B is small."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in _SMS:
            _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        sms = _SMS[idx]
    else:
        sms = 64
    want = max(1, (2 * sms) // max(1, batch))
    most = max(1, cdiv(vocab, block_v))  # no empty slices
    return int(min(32, most, 1 << (want.bit_length() - 1)))


def verify_split(draft: torch.Tensor, num: torch.Tensor, target: torch.Tensor, q: torch.Tensor,
                 ua: torch.Tensor, us: torch.Tensor, s_q: tuple[int, int, int], *, greedy: bool, split: int,
                 block_v: int, num_warps: int, num_stages: int,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accept_len [B] int32, next_token [B] int64, tokens [B, G+1] int64); arguments prepared by
    verify.verify_triton (contiguous last dims, int32 lengths, placeholders for greedy)."""
    b, g = draft.shape
    v = target.shape[2]
    dev = draft.device
    chunk = cdiv(cdiv(v, split), block_v) * block_v  # slice length, a multiple of the block
    s = cdiv(v, chunk)  # slices actually needed
    if greedy:
        pv = torch.empty(b, g + 1, s, device=dev, dtype=torch.float32)
        pi = torch.empty(b, g + 1, s, device=dev, dtype=torch.int64)
    else:
        pv = torch.empty(b, s, device=dev, dtype=torch.float32)
        pi = torch.empty(b, s, device=dev, dtype=torch.float32)
    acc = torch.empty(b, device=dev, dtype=torch.int32)
    nxt = torch.empty(b, device=dev, dtype=torch.int64)
    out = torch.empty(b, g + 1, device=dev, dtype=torch.int64)
    strides = (draft.stride(0), target.stride(0), target.stride(1), *s_q)
    on_cpu = not draft.is_cuda
    launch(_partial_kernel, (b, s), draft, num, target, q, ua, pv, pi, g, v, s, chunk, *strides, on_cpu=on_cpu,
           GREEDY=greedy, BLOCK_V=block_v, num_warps=num_warps, num_stages=num_stages)
    launch(_finalize_kernel, (b,), draft, num, target, q, ua, us, pv, pi, acc, nxt, out, g, v, s, chunk,
           *strides, on_cpu=on_cpu, GREEDY=greedy, BLOCK_V=block_v, BLOCK_G=pow2_ceil(g + 1),
           BLOCK_S=pow2_ceil(s), num_warps=num_warps, num_stages=num_stages)
    return acc, nxt, out
