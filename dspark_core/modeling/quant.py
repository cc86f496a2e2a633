"""Weight-only quantised linear layers: what `weights.dtype: fp8 | int8 | int4 | nvfp4` runs in the bundled engine.

Each format stores the weight's codes and scales and computes y = x @ dequant(W)^T + b:
* fp8: e4m3 codes, one fp32 scale per output channel (amax / 448). On CUDA sm89+ (Ada, Hopper, Blackwell) the
  matmul runs in FP8 with `torch._scaled_mm`: the activations are quantised per tensor on the fly (dynamic
  scaling, as vLLM's and SGLang's `fp8` checkpoints-from-bf16 do) and the per-channel weight scale is applied
  to the output, which is exact because it factors out of the sum over the input dimension. Elsewhere (CPU,
  older GPUs, shapes `_scaled_mm` refuses) the weight is dequantised per call: the reference path, the same
  numbers without the FP8 tensor cores.
* int8: symmetric per output channel (amax / 127), the W8A16 layout.
* int4: symmetric per group of 128 input columns (fewer when the width is not a multiple of 128; amax / 7),
  round-to-nearest, two codes per byte: the layout of AWQ / GPTQ W4A16 checkpoints without their calibration.
* nvfp4: E2M1 codes (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and signs) per block of 16 input columns, each block
  scaled by an e4m3 factor under one fp32 per-tensor scale (NVIDIA's NVFP4), two codes per byte.
int8 / int4 / nvfp4 always take the dequantising path here: the engine has no integer or FP4 GEMM kernels, so
they compute what such a checkpoint computes, not at its speed. Embeddings, norms and the LM head stay in the
activation dtype, as in vLLM's and SGLang's quantised checkpoints.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
INT4_GROUP = 128  # input columns per int4 scale (a narrower width takes the largest divisor of 128 it has)
FP4_BLOCK = 16  # input columns per nvfp4 block scale
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes; code bit 3 is the sign
FORMATS = ("fp8", "int8", "int4", "nvfp4")


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    """[out, in] uint8 codes < 16 (in even) -> [out, in / 2] uint8, low nibble first."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def _unpack4(packed: torch.Tensor) -> torch.Tensor:
    """[out, in / 2] uint8 -> [out, in] uint8 codes."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _fp4_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (sign in bit 3) of each value of x, already divided by its scales."""
    mags = torch.tensor(FP4_VALUES, device=x.device)
    idx = (x.abs().unsqueeze(-1) - mags).abs().argmin(-1).to(torch.uint8)
    return idx | ((x < 0).to(torch.uint8) << 3)


class QuantLinear(nn.Module):
    """A bias-optional linear layer holding quantised weight codes and their scales (see the module docstring)."""

    def __init__(self, fmt: str, codes: torch.Tensor, scales: torch.Tensor, shape: tuple[int, int],
                 bias: torch.Tensor | None, dtype: torch.dtype, global_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.fmt, self.out_features, self.in_features, self.dtype = fmt, shape[0], shape[1], dtype
        self.register_buffer("codes", codes)  # fp8: e4m3 [out, in]; int8: int8 [out, in]; 4-bit: uint8 [out, in/2]
        self.register_buffer("scales", scales)  # fp8 / int8: [out]; int4: [out, in/128]; nvfp4: e4m3 [out, in/16]
        self.register_buffer("global_scale", global_scale)  # nvfp4: fp32 scalar over the block scales
        self.bias = nn.Parameter(bias.to(dtype), requires_grad=False) if bias is not None else None

    @classmethod
    def quantize(cls, linear: nn.Linear, fmt: str) -> QuantLinear:
        """Quantise `linear`'s weight (round-to-nearest, no calibration data)."""
        w = linear.weight.detach().float()
        out_f, in_f = w.shape
        bias = linear.bias.detach() if linear.bias is not None else None
        dt = linear.weight.dtype
        if fmt == "fp8":
            scale = (w.abs().amax(1) / E4M3_MAX).clamp(min=1e-12)
            codes = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            return cls(fmt, codes, scale, (out_f, in_f), bias, dt)
        if fmt == "int8":
            scale = (w.abs().amax(1) / 127.0).clamp(min=1e-12)
            codes = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
            return cls(fmt, codes, scale, (out_f, in_f), bias, dt)
        if fmt == "int4":
            group = math.gcd(in_f, INT4_GROUP)
            if group < 2:
                raise ValueError(f"int4 needs an even input width, got {in_f}")
            g = w.view(out_f, in_f // group, group)
            scale = (g.abs().amax(-1) / 7.0).clamp(min=1e-12)  # [out, groups]
            q = (g / scale[..., None]).round().clamp(-8, 7).to(torch.int16) + 8
            return cls(fmt, _pack4(q.view(out_f, in_f).to(torch.uint8)), scale, (out_f, in_f), bias, dt)
        if fmt == "nvfp4":
            if in_f % FP4_BLOCK:
                raise ValueError(f"nvfp4 needs input width divisible by {FP4_BLOCK}, got {in_f}")
            b = w.view(out_f, in_f // FP4_BLOCK, FP4_BLOCK)
            block = b.abs().amax(-1) / FP4_VALUES[-1]  # the scale that maps each block's amax onto 6
            gscale = (block.amax() / E4M3_MAX).clamp(min=1e-12)
            bscale = (block / gscale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
            eff = (bscale.float() * gscale).clamp(min=1e-12)
            codes = _fp4_codes(b / eff[..., None]).view(out_f, in_f)
            return cls(fmt, _pack4(codes), bscale, (out_f, in_f), bias, dt, gscale.reshape(()))
        raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")

    def dequantized(self) -> torch.Tensor:
        """[out, in] weight in the activation dtype: what every path multiplies by."""
        if self.fmt in ("fp8", "int8"):
            w = self.codes.float() * self.scales[:, None]
        elif self.fmt == "int4":
            q = _unpack4(self.codes).float() - 8
            group = self.in_features // self.scales.shape[1]
            w = (q.view(self.out_features, -1, group) * self.scales[..., None]).view(self.out_features, -1)
        else:
            c = _unpack4(self.codes)
            mags = torch.tensor(FP4_VALUES, device=c.device)[(c & 7).long()]
            vals = torch.where((c & 8).bool(), -mags, mags)
            eff = self.scales.float() * self.global_scale
            w = (vals.view(self.out_features, -1, FP4_BLOCK) * eff[..., None]).view(self.out_features, -1)
        return w.to(self.dtype)

    def scaled_mm_ok(self, x: torch.Tensor) -> bool:
        """Whether the FP8 tensor-core path applies: fp8 weights, CUDA sm89+, shapes `_scaled_mm` takes."""
        if self.fmt != "fp8" or not x.is_cuda or not hasattr(torch, "_scaled_mm"):
            return False
        major, minor = torch.cuda.get_device_capability(x.device)
        return major * 10 + minor >= 89 and self.in_features % 16 == 0 and self.out_features % 16 == 0

    def forward_scaled_mm(self, x: torch.Tensor) -> torch.Tensor:
        """FP8 x FP8 matmul: per-tensor dynamic activation scale, per-channel weight scale on the output."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        sx = (x2.abs().amax().float() / E4M3_MAX).clamp(min=1e-12)
        xq = (x2.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        one = torch.ones((), device=x.device, dtype=torch.float32)
        y = torch._scaled_mm(xq, self.codes.t(), scale_a=sx.reshape(()), scale_b=one, out_dtype=torch.float32)
        y = y * self.scales[None, :]
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*lead, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scaled_mm_ok(x):
            return self.forward_scaled_mm(x)
        return F.linear(x, self.dequantized(), self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.fmt}"


def quantize_linears(model: nn.Module, fmt: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every nn.Linear under `model` (but those named in `skip`) by its QuantLinear; returns how many."""
    n = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and child_name not in skip and full not in skip:
                setattr(module, child_name, QuantLinear.quantize(child, fmt))
                n += 1
    return n
