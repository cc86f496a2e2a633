"""Fused sequential-head step for one block position k (the DSpark Markov head, DESIGN.md section 4):

    z = (U_k + W1[x_{k-1}] @ W2) / T          U_k [B, V] base logits, W1 [V, r], W2 [r, V], T [B] > 0
    token = argmax(z)                          greedy
    token = argmax(z + Gumbel(u))              sampling, Gumbel(u) = -log(-log(u)), u [B, V] given uniforms

Gumbel-max with given uniforms draws exactly from softmax(z) and lets the Triton kernel and the torch
reference agree token for token from the same numbers (up to ties within rounding). z is optionally
written out: softmax(z) is the draft distribution q the verifier needs for rejection sampling.

Why a kernel: unfused, the bias is a [B, V] GEMM output written and re-read three times (add, scale,
argmax). Here grid = (vocab tiles, batch tiles): each program loads one W2 tile [r, BLOCK_V] once for
BLOCK_B requests (W2 is r*V*2 bytes = 78 MB at V = 152k, r = 256: reading it once per request would
dominate), does the GEMM with tl.dot, adds U, scales, and reduces its tile to a (max, argmax) partial; a
second small launch reduces the partials per request. Two launches, no host sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .registry import KernelEntry, mismatch_fraction
from .spec import KernelSpec, cdiv, launch, pow2_ceil, resolve_config, use_triton

SPEC = KernelSpec(
    name="markov_head",
    space={"BLOCK_V": (64, 128, 256), "BLOCK_B": (16, 32, 64), "BLOCK_R": (32, 64, 128),
           "num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4)},
    defaults={
        "default": {"BLOCK_V": 128, "BLOCK_B": 16, "BLOCK_R": 64, "num_warps": 4, "num_stages": 2},
        "ampere": {"BLOCK_V": 128, "BLOCK_B": 32, "BLOCK_R": 64, "num_warps": 4, "num_stages": 3},
        "hopper": {"BLOCK_V": 128, "BLOCK_B": 64, "BLOCK_R": 64, "num_warps": 8, "num_stages": 3},
        "blackwell": {"BLOCK_V": 128, "BLOCK_B": 64, "BLOCK_R": 64, "num_warps": 8, "num_stages": 3},
    },
    doc="Markov-head step: base logits + W1[x_prev] @ W2 bias, temperature, Gumbel-max or argmax",
)

U_MIN = 1e-20  # uniforms are clamped into [U_MIN, U_MAX] so the Gumbel noise stays finite
U_MAX = 0.99999988


def shape_bucket(shape: Mapping[str, int]) -> str:
    return f"B{pow2_ceil(shape['batch'])}-V{pow2_ceil(shape['vocab'])}-r{shape['rank']}"


def markov_step(base: torch.Tensor, x_prev: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                temperature: torch.Tensor | None, uniforms: torch.Tensor | None, *, greedy: bool,
                return_logits: bool = False, backend: str | None = None,
                config: Mapping[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token [B] int64, z [B, V] fp32 or None) for one block position.

    base [B, V]; x_prev [B] int64; w1 [V, r]; w2 [r, V]; temperature [B] (None = 1); uniforms [B, V] fp32
    in (0, 1) for sampling (ignored when greedy).
    """
    b, v = base.shape
    if tuple(x_prev.shape) != (b,) or w1.shape[0] != v or w2.shape != (w1.shape[1], v):
        raise ValueError(f"markov_step: base {tuple(base.shape)}, x_prev {tuple(x_prev.shape)}, "
                         f"w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}")
    if not greedy and (uniforms is None or tuple(uniforms.shape) != (b, v)):
        raise ValueError("markov_step: sampling needs uniforms [B, V]")
    if use_triton(base, backend):
        return markov_step_triton(base, x_prev, w1, w2, temperature, uniforms, greedy=greedy,
                                  return_logits=return_logits, config=config)
    return markov_step_torch(base, x_prev, w1, w2, temperature, uniforms, greedy=greedy,
                             return_logits=return_logits)


def markov_step_torch(base: torch.Tensor, x_prev: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                      temperature: torch.Tensor | None, uniforms: torch.Tensor | None, *, greedy: bool,
                      return_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference: gather, GEMM, add, scale, argmax in eager torch (fp32 accumulation)."""
    e = w1[x_prev].float()  # [B, r]
    z = base.float() + e @ w2.float()  # [B, V]
    if temperature is not None:
        z = z / temperature.float()[:, None]
    if greedy:
        tok = z.argmax(dim=-1)
    else:
        assert uniforms is not None
        u = uniforms.float().clamp(U_MIN, U_MAX)
        tok = (z - torch.log(-torch.log(u))).argmax(dim=-1)
    return tok, (z if return_logits else None)


@triton.jit
def _markov_tile_kernel(
    base_ptr, xp_ptr, w1_ptr, w2_ptr, t_ptr, u_ptr,  # [B,V], [B], [V,r], [r,V], [B], [B,V]
    z_ptr, pmax_ptr, pidx_ptr,  # out: [B,V] fp32 (optional), partials [B, NV] fp32 / int64
    B, V, R, NV,
    s_base, s_w1, s_w2, s_u, s_z,
    GREEDY: tl.constexpr, HAS_T: tl.constexpr, WRITE_Z: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)  # [BLOCK_B]
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    rmask = rows < B
    cmask = cols < V
    xp = tl.load(xp_ptr + rows, mask=rmask, other=0).to(tl.int64)  # [BLOCK_B]
    acc = tl.zeros([BLOCK_B, BLOCK_V], tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        rm = rr < R
        e = tl.load(w1_ptr + xp[:, None] * s_w1 + rr[None, :], mask=rmask[:, None] & rm[None, :], other=0.0)
        w = tl.load(w2_ptr + rr[:, None].to(tl.int64) * s_w2 + cols[None, :],
                    mask=rm[:, None] & cmask[None, :], other=0.0)
        if UPCAST:  # the interpreter cannot multiply bf16 tiles; exact products either way
            acc = tl.dot(e.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        elif IEEE:
            acc = tl.dot(e, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(e, w, acc)
    m2 = rmask[:, None] & cmask[None, :]
    r64 = rows.to(tl.int64)
    base = tl.load(base_ptr + r64[:, None] * s_base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    z = base + acc
    if HAS_T:
        t = tl.load(t_ptr + rows, mask=rmask, other=1.0).to(tl.float32)
        z = z / t[:, None]
    if WRITE_Z:
        tl.store(z_ptr + r64[:, None] * s_z + cols[None, :], z, mask=m2)
    if GREEDY:
        s = z
    else:
        u = tl.load(u_ptr + r64[:, None] * s_u + cols[None, :], mask=m2, other=0.5).to(tl.float32)
        u = tl.minimum(tl.maximum(u, 1e-20), 0.99999988)
        s = z - tl.log(-tl.log(u))
    s = tl.where(cmask[None, :], s, float("-inf"))
    bm = tl.max(s, 1)  # [BLOCK_B]
    bi = tl.argmax(s, 1).to(tl.int64) + pid_v * BLOCK_V
    tl.store(pmax_ptr + r64 * NV + pid_v, bm, mask=rmask)
    tl.store(pidx_ptr + r64 * NV + pid_v, bi, mask=rmask)


@triton.jit
def _markov_reduce_kernel(pmax_ptr, pidx_ptr, tok_ptr, NV, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    best_v = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int64)
    for off in range(0, NV, BLOCK_N):
        j = off + tl.arange(0, BLOCK_N)
        v = tl.load(pmax_ptr + b * NV + j, mask=j < NV, other=float("-inf"))
        i = tl.load(pidx_ptr + b * NV + j, mask=j < NV, other=0)
        bm = tl.max(v, 0)
        # first partial holding the max = lowest vocabulary index (partials are in vocabulary order)
        k = tl.argmax(v, 0)
        bi = tl.sum(tl.where(tl.arange(0, BLOCK_N) == k, i, 0), 0)
        upd = bm > best_v
        best_i = tl.where(upd, bi, best_i)
        best_v = tl.where(upd, bm, best_v)
    tl.store(tok_ptr + b, best_i)


def markov_step_triton(base: torch.Tensor, x_prev: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                       temperature: torch.Tensor | None, uniforms: torch.Tensor | None, *, greedy: bool,
                       return_logits: bool = False,
                       config: Mapping[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tile kernel over (cdiv(V, BLOCK_V), cdiv(B, BLOCK_B)) then a per-request reduce."""
    b, v = base.shape
    r = w1.shape[1]
    cfg = resolve_config(SPEC, shape_bucket({"batch": b, "vocab": v, "rank": r}), base.device, config)
    base = base if base.stride(-1) == 1 else base.contiguous()
    w1 = w1 if w1.stride(-1) == 1 else w1.contiguous()
    w2 = w2 if w2.stride(-1) == 1 else w2.contiguous()
    if w1.dtype != w2.dtype:
        w1 = w1.to(w2.dtype)
    nv = cdiv(v, cfg["BLOCK_V"])
    dev = base.device
    pmax = torch.empty(b, nv, device=dev, dtype=torch.float32)
    pidx = torch.empty(b, nv, device=dev, dtype=torch.int64)
    z = torch.empty(b, v, device=dev, dtype=torch.float32) if return_logits else pmax
    t = temperature.float().contiguous() if temperature is not None else pmax
    u = uniforms if (uniforms is not None and not greedy) else pmax
    s_u = u.stride(0) if u is not pmax else 0
    tok = torch.empty(b, device=dev, dtype=torch.int64)
    on_cpu = not base.is_cuda
    launch(_markov_tile_kernel, (nv, cdiv(b, cfg["BLOCK_B"])), base, x_prev, w1, w2, t, u, z, pmax, pidx,
           b, v, r, nv, base.stride(0), w1.stride(0), w2.stride(0), s_u, z.stride(0) if return_logits else 0,
           on_cpu=on_cpu, GREEDY=greedy, HAS_T=temperature is not None, WRITE_Z=return_logits,
           IEEE=w2.dtype == torch.float32, UPCAST=on_cpu, BLOCK_B=cfg["BLOCK_B"], BLOCK_V=cfg["BLOCK_V"],
           BLOCK_R=cfg["BLOCK_R"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    launch(_markov_reduce_kernel, (b,), pmax, pidx, tok, nv, on_cpu=on_cpu,
           BLOCK_N=min(1024, pow2_ceil(nv)), num_warps=4, num_stages=1)
    return tok, (z if return_logits else None)


def make_inputs(shape: Mapping[str, int], device: torch.device | str, seed: int, greedy: bool,
                dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Random head step for shape {batch, vocab, rank}; weights in `dtype`, base logits fp32."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    b, v, r = shape["batch"], shape["vocab"], shape["rank"]
    out: dict[str, Any] = {
        "base": (torch.randn(b, v, generator=gen) * 2.0).to(device),
        "x_prev": torch.randint(0, v, (b,), generator=gen).to(device),
        "w1": (torch.randn(v, r, generator=gen) / r ** 0.5).to(device=device, dtype=dtype),
        "w2": torch.randn(r, v, generator=gen).to(device=device, dtype=dtype),
        "temperature": (0.5 + torch.rand(b, generator=gen)).to(device),
        "uniforms": None if greedy else torch.rand(b, v, generator=gen).to(device),
        "greedy": greedy,
    }
    return out


def _run_triton(inputs: dict[str, Any], config: Mapping[str, int] | None) -> tuple[torch.Tensor, Any]:
    return markov_step(**inputs, return_logits=True, backend="triton", config=config)


def _run_torch(inputs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    return markov_step(**inputs, return_logits=True, backend="torch")


def _check(out: tuple[torch.Tensor, Any], ref: tuple[torch.Tensor, Any], _inputs: dict[str, Any]) -> None:
    torch.testing.assert_close(out[1].cpu(), ref[1].cpu(), rtol=1e-4, atol=1e-3)
    frac = mismatch_fraction(out[0].cpu(), ref[0].cpu())  # only near-ties may flip
    assert frac <= 0.01, f"markov_head: {frac:.1%} of tokens differ"


def _bytes(shape: Mapping[str, int]) -> int:
    b, v, r = shape["batch"], shape["vocab"], shape["rank"]
    return r * v * 2 + b * v * 4 * 3  # W2 (bf16) once + base logits, uniforms, z (fp32)


ENTRY = KernelEntry(
    spec=SPEC, shape_keys=("batch", "vocab", "rank"), bucket=shape_bucket,
    make_inputs=lambda shape, device, seed: make_inputs(shape, device, seed, greedy=False,
                                                        dtype=torch.bfloat16),
    run_triton=_run_triton, run_torch=_run_torch, check=_check, bytes_moved=_bytes)
