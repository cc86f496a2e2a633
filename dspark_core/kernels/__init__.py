"""Triton kernels for the DSpark hot path, each with its PyTorch reference in the same file.

    verify.py            batched greedy / rejection-sampling verification over [B, gamma, V], one launch
    verify_split.py      its small-batch variant: vocabulary split over programs, two launches
    markov_head.py       fused Markov-head step: base logits + W1[x_prev] @ W2, temperature, sampling
    rmsnorm.py           RMSNorm with the residual add fused in
    swiglu.py            silu(gate) * up
    prefix_admission.py  scheduler survival + admission, vectorised torch; why it is not a kernel
    spec.py              config spaces, per-arch defaults, tuned-config table, backend choice
    registry.py          uniform entry points for the tuner and benchmarks/gpu_kernels.py

Every public function takes `backend` ("auto": Triton on CUDA, torch elsewhere; or forced) and an optional
`config`; without one the tuned table (`spec.load_tuned`, filled from a bundle's kernels.json) or the
architecture default applies. Kernel modules import triton, and Triton decides whether to run in its CPU
interpreter when it is first imported: import these modules lazily (inside functions) from engine code,
so that tests can set TRITON_INTERPRET=1 first. This __init__ imports nothing heavy.
"""

from __future__ import annotations

from .registry import KERNEL_NAMES

__all__ = ["KERNEL_NAMES"]
