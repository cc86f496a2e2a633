"""SwiGLU activation: silu(gate) * up, computed in fp32 and rounded once to the input dtype.

gate and up may be views of one packed [N, 2I] projection (gate_up[..., :I], gate_up[..., I:]): the kernel
takes row strides, so no copy is made. Elementwise and memory-bound (reads 2, writes 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .registry import KernelEntry
from .spec import KernelSpec, cdiv, launch, pow2_ceil, resolve_config, use_triton

SPEC = KernelSpec(
    name="swiglu",
    space={"BLOCK": (256, 512, 1024, 2048, 4096), "num_warps": (1, 2, 4, 8, 16), "num_stages": (1, 2)},
    defaults={
        "default": {"BLOCK": 1024, "num_warps": 4, "num_stages": 1},
        "ampere": {"BLOCK": 1024, "num_warps": 4, "num_stages": 1},
        "hopper": {"BLOCK": 2048, "num_warps": 8, "num_stages": 1},
        "blackwell": {"BLOCK": 2048, "num_warps": 8, "num_stages": 1},
    },
    doc="SwiGLU: silu(gate) * up",
)


def shape_bucket(shape: Mapping[str, int]) -> str:
    return f"N{pow2_ceil(shape['rows'])}-I{pow2_ceil(shape['inter'])}"


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: str | None = None,
           config: Mapping[str, int] | None = None) -> torch.Tensor:
    """silu(gate) * up for gate, up [..., I] (same shape and dtype)."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} {gate.dtype} vs up {tuple(up.shape)} {up.dtype}")
    if use_triton(gate, backend):
        return swiglu_triton(gate, up, config=config)
    return swiglu_torch(gate, up)


def swiglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Reference."""
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, o_ptr, n_inter, s_g, s_u, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < n_inter
    g = tl.load(g_ptr + row * s_g + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * s_u + c, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(o_ptr + row * s_o + c, y.to(o_ptr.dtype.element_ty), mask=m)


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor, *,
                  config: Mapping[str, int] | None = None) -> torch.Tensor:
    """Grid (rows, cdiv(I, BLOCK))."""
    shape = gate.shape
    i = shape[-1]
    g2 = gate.reshape(-1, i) if gate.dim() != 2 else gate
    u2 = up.reshape(-1, i) if up.dim() != 2 else up
    if g2.stride(-1) != 1:
        g2 = g2.contiguous()
    if u2.stride(-1) != 1:
        u2 = u2.contiguous()
    n = g2.shape[0]
    cfg = resolve_config(SPEC, shape_bucket({"rows": n, "inter": i}), gate.device, config)
    out = torch.empty(n, i, device=gate.device, dtype=gate.dtype)
    launch(_swiglu_kernel, (n, cdiv(i, cfg["BLOCK"])), g2, u2, out, i, g2.stride(0), u2.stride(0),
           out.stride(0), on_cpu=not gate.is_cuda, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"],
           num_stages=cfg["num_stages"])
    return out.reshape(shape)


def make_inputs(shape: Mapping[str, int], device: torch.device | str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """A packed gate_up projection output [rows, 2*inter], passed as two strided views."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    n, i = shape["rows"], shape["inter"]
    gu = (torch.randn(n, 2 * i, generator=gen) * 2.0).to(device=device, dtype=dtype)
    return {"gate": gu[:, :i], "up": gu[:, i:]}


def _check(out: torch.Tensor, ref: torch.Tensor, _inputs: dict[str, Any]) -> None:
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), rtol=1.6e-2, atol=1e-2)


ENTRY = KernelEntry(
    spec=SPEC, shape_keys=("rows", "inter"), bucket=shape_bucket, make_inputs=make_inputs,
    run_triton=lambda inputs, config: swiglu(**inputs, backend="triton", config=config),
    run_torch=lambda inputs: swiglu(**inputs, backend="torch"), check=_check,
    bytes_moved=lambda shape: 3 * shape["rows"] * shape["inter"] * 2)
