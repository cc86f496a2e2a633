"""Linear layers with weights pre-packed by oneDNN: the CPU kernel that makes verification cost what decode does.

PyTorch's `F.linear` on a CPU calls MKL's sgemm on the plain [out, in] weight. At one row that streams the weights
(memory-bound); at 9 rows (a verify block) MKL's small-M path reaches ~10% of the FMA peak, so on an AVX2-only CPU
verifying 9 tokens of SmolLM2-135M costs ~2x a decode step in fp32 (benchmarks/step_limit.py). oneDNN's inner
product on a weight reordered once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the layout
inductor's freezing pass uses for low-precision weights) streams faster at one row and keeps 9 rows at ~1.4x one.

* Packed for `ROW_HINT` rows: one packed copy serves decode (1 row per request) and verify blocks (up to 16)
  alike; packing for 1 row instead makes 9 rows ~1.5x slower (measured, issue 41).
* Where: a CPU model whose dtype oneDNN packs here (fp32 everywhere; bf16 only with AVX512-BF16 / AVX-NE-CONVERT /
  AMX, which `supported` asks oneDNN about). Elsewhere the model keeps `nn.Linear`.
* Under `torch.compile` the packed call is the custom op `dspark::packed_linear` (an opaque extern kernel between
  inductor's fused pointwise code): inductor cannot lower an opaque oneDNN tensor passed in from outside.
* `weight` unpacks a plain copy for the rare reader (export, training): the packed tensor is the only copy held.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch import nn

ROW_HINT = 16  # rows the weights are packed for (decode 1 .. verify 16 run on the same copy)
_LAYERS: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()  # index -> live layer
_NEXT = itertools.count()  # layer indices, never reused


def supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and runs linear weights of `dtype` on this CPU."""
    if not (torch.backends.mkldnn.is_available() and dtype in (torch.float32, torch.bfloat16)):
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), ROW_HINT)
    except RuntimeError:  # this CPU lacks the instructions oneDNN's packed path needs for dtype
        return False
    return True


@torch.library.custom_op("dspark::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, index: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] -> [..., out] with the packed weight of layer `index` (the compiled graph's call)."""
    return torch.ops.mkldnn._linear_pointwise(x, _LAYERS[index].packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, index: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], _LAYERS[index].out_features)


class PackedLinear(nn.Module):
    """y = x W^T + b with W held only in oneDNN's packed layout (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROW_HINT)  # opaque oneDNN
        self.index = next(_NEXT)  # how the compiled graph's op finds this layer
        _LAYERS[self.index] = self
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """A plain [out, in] copy of the weight (export, training); the forward never uses it."""
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if torch.compiler.is_compiling():
            return packed_linear(x, self.index, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def apply_kernel(model: nn.Module, choice: str) -> str:
    """The linear kernel `model` runs with for config `weights.cpu_kernel` = `choice` (auto | onednn | torch),
    packing its weights for onednn; one DSparkError line when onednn is asked for where it cannot run."""
    if choice == "torch" or model.device.type != "cpu":
        return "torch"
    if pack_linears(model) or isinstance(model.lm_head, PackedLinear):  # packed now, or by an earlier engine
        return "onednn"
    if choice == "onednn":
        from dspark_core.errors import DSparkError

        raise DSparkError(f"weights.cpu_kernel onednn: oneDNN does not pack {str(model.dtype).removeprefix('torch.')}"
                          f" weights on this CPU ({torch.backends.cpu.get_cpu_capability()}); use auto or torch")
    return "torch"


def pack_linears(model: nn.Module) -> int:
    """Replace a CPU LeanModel's projections and LM head with PackedLinear where oneDNN packs its dtype; the
    number of layers packed (0: the model keeps nn.Linear). A tied LM head keeps the embedding's plain copy for
    the lookup, so it adds its bytes once."""
    if model.device.type != "cpu" or not supported(model.dtype):
        return 0
    n = 0
    for layer in model.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            if type(getattr(layer, name)) is nn.Linear:
                setattr(layer, name, PackedLinear(getattr(layer, name)))
                n += 1
    if type(model.lm_head) is nn.Linear:
        model.lm_head = PackedLinear(model.lm_head)
        n += 1
    return n
