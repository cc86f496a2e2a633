"""RMSNorm with the residual add fused in: one read of x and residual, one write of each output.

    new_residual = x + residual                 (in x's dtype, like the unfused model code)
    out = weight * (new_residual * rsqrt(mean(new_residual^2) + eps)).to(dtype)

Without a residual it is a plain RMSNorm. The statistic is computed in fp32 from the stored (rounded)
residual, so the next layer and this norm see the same numbers - the same order of rounding as Hugging
Face's Qwen3RMSNorm applied after an unfused add. Memory-bound: the GPU benchmark's target is >= 80% of
measured DRAM bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .registry import KernelEntry
from .spec import KernelSpec, launch, pow2_ceil, resolve_config, use_triton

SPEC = KernelSpec(
    name="rmsnorm",
    # BLOCK_H = 0 means "the whole row in one block" (next power of two >= hidden); otherwise a chunk size
    # and a two-pass loop (for very wide rows that would spill registers).
    space={"BLOCK_H": (0, 1024, 2048, 4096), "num_warps": (1, 2, 4, 8, 16, 32), "num_stages": (1, 2)},
    defaults={
        "default": {"BLOCK_H": 0, "num_warps": 4, "num_stages": 1},
        "ampere": {"BLOCK_H": 0, "num_warps": 8, "num_stages": 1},
        "hopper": {"BLOCK_H": 0, "num_warps": 8, "num_stages": 1},
        "blackwell": {"BLOCK_H": 0, "num_warps": 8, "num_stages": 1},
    },
    doc="RMSNorm with fused residual add (returns normed output and new residual)",
)


def shape_bucket(shape: Mapping[str, int]) -> str:
    """Rows rounded up to a power of two, hidden size exact (it fixes the block)."""
    return f"N{pow2_ceil(shape['rows'])}-H{shape['hidden']}"


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
            backend: str | None = None,
            config: Mapping[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, new_residual) for x [..., H]; new_residual is x itself when no residual is given."""
    if x.shape[-1] != weight.shape[0] or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"rmsnorm: x {tuple(x.shape)}, residual "
                         f"{None if residual is None else tuple(residual.shape)}, weight {tuple(weight.shape)}")
    if use_triton(x, backend):
        return rmsnorm_triton(x, weight, eps, residual, config=config)
    return rmsnorm_torch(x, weight, eps, residual)


def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float,
                  residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: the unfused model code."""
    new_res = x + residual if residual is not None else x  # [..., H] in x.dtype
    h = new_res.float()
    normed = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = (weight.float() * normed.to(x.dtype).float()).to(x.dtype)
    return out, new_res


@triton.jit
def _rmsnorm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr,  # x, residual, new residual: [N, H]; w: [H]
    H, s_x, s_r, s_o, s_ro, eps,
    HAS_RES: tl.constexpr, BLOCK_H: tl.constexpr, ONE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    if ONE_PASS:
        m = cols < H
        x = tl.load(x_ptr + row * s_x + cols, mask=m, other=0.0)
        if HAS_RES:
            r = tl.load(r_ptr + row * s_r + cols, mask=m, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) + r).to(x_ptr.dtype.element_ty)  # add in fp32, round once (as torch)
            tl.store(res_out_ptr + row * s_ro + cols, x, mask=m)
        h = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(h * h, 0) / H + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        y = (h * inv).to(x_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(out_ptr + row * s_o + cols, y.to(out_ptr.dtype.element_ty), mask=m)
    else:
        acc = tl.zeros([BLOCK_H], tl.float32)
        for off in range(0, H, BLOCK_H):
            c = off + cols
            m = c < H
            x = tl.load(x_ptr + row * s_x + c, mask=m, other=0.0)
            if HAS_RES:
                r = tl.load(r_ptr + row * s_r + c, mask=m, other=0.0).to(tl.float32)
                x = (x.to(tl.float32) + r).to(x_ptr.dtype.element_ty)
                tl.store(res_out_ptr + row * s_ro + c, x, mask=m)
            h = x.to(tl.float32)
            acc += h * h
        inv = 1.0 / tl.sqrt(tl.sum(acc, 0) / H + eps)
        src = res_out_ptr if HAS_RES else x_ptr
        s_src = s_ro if HAS_RES else s_x
        for off in range(0, H, BLOCK_H):
            c = off + cols
            m = c < H
            h = tl.load(src + row * s_src + c, mask=m, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
            y = (h * inv).to(x_ptr.dtype.element_ty).to(tl.float32) * w
            tl.store(out_ptr + row * s_o + c, y.to(out_ptr.dtype.element_ty), mask=m)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                   *, config: Mapping[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Grid (rows,); one program normalises one row."""
    shape = x.shape
    h = shape[-1]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n = x2.shape[0]
    cfg = resolve_config(SPEC, shape_bucket({"rows": n, "hidden": h}), x.device, config)
    block = pow2_ceil(h) if cfg["BLOCK_H"] == 0 else min(cfg["BLOCK_H"], pow2_ceil(h))
    out = torch.empty_like(x2)
    if residual is not None:
        r2 = residual.reshape(-1, h)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty_like(x2)
    else:
        r2, res_out = x2, x2
    launch(_rmsnorm_kernel, (n,), x2, r2, weight, out, res_out, h, x2.stride(0), r2.stride(0), out.stride(0),
           res_out.stride(0), float(eps), on_cpu=not x.is_cuda, HAS_RES=residual is not None, BLOCK_H=block,
           ONE_PASS=block >= h, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out.reshape(shape), (res_out.reshape(shape) if residual is not None else x)


def make_inputs(shape: Mapping[str, int], device: torch.device | str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Random activations for shape {rows, hidden}."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    n, h = shape["rows"], shape["hidden"]
    return {"x": torch.randn(n, h, generator=gen).to(device=device, dtype=dtype),
            "residual": torch.randn(n, h, generator=gen).to(device=device, dtype=dtype),
            "weight": (1.0 + 0.1 * torch.randn(h, generator=gen)).to(device=device, dtype=dtype),
            "eps": 1e-6}


def _check(out: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor],
           _inputs: dict[str, Any]) -> None:
    for a, b in zip(out, ref, strict=True):  # within a bf16 rounding step (interpreter rounds toward zero)
        torch.testing.assert_close(a.float().cpu(), b.float().cpu(), rtol=1.6e-2, atol=1.6e-2)


ENTRY = KernelEntry(
    spec=SPEC, shape_keys=("rows", "hidden"), bucket=shape_bucket, make_inputs=make_inputs,
    run_triton=lambda inputs, config: rmsnorm(**inputs, backend="triton", config=config),
    run_torch=lambda inputs: rmsnorm(**inputs, backend="torch"), check=_check,
    bytes_moved=lambda shape: 4 * shape["rows"] * shape["hidden"] * 2 + shape["hidden"] * 2)
