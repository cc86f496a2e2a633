"""The kernels the tuner and the GPU benchmark know, behind one uniform interface.

Each entry says how to build random inputs for a shape, run the Triton kernel with a config, run the torch
reference, and check one against the other. Kernel modules are imported on first use (they import triton).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .spec import KernelSpec

KERNEL_NAMES: tuple[str, ...] = ("verify_greedy", "verify_sample", "markov_head", "rmsnorm", "swiglu")


@dataclass(frozen=True)
class KernelEntry:
    """What a tuner or benchmark needs to run one kernel at one shape."""

    spec: KernelSpec  # config space + per-arch defaults
    shape_keys: tuple[str, ...]  # the shape dict's keys, e.g. ("rows", "hidden")
    bucket: Callable[[Mapping[str, int]], str]  # shape -> bucket key of tuned configs
    make_inputs: Callable[[Mapping[str, int], torch.device | str, int], dict[str, Any]]  # shape, device, seed
    run_triton: Callable[[dict[str, Any], Mapping[str, int] | None], Any]  # inputs, config -> outputs
    run_torch: Callable[[dict[str, Any]], Any]  # inputs -> outputs (the reference)
    check: Callable[[Any, Any, dict[str, Any]], None]  # (triton out, reference out, inputs) -> AssertionError
    bytes_moved: Callable[[Mapping[str, int]], int]  # minimal DRAM bytes per call (bandwidth figures)


_WHERE: dict[str, tuple[str, str]] = {
    "verify_greedy": ("verify", "ENTRY_GREEDY"),
    "verify_sample": ("verify", "ENTRY_SAMPLE"),
    "markov_head": ("markov_head", "ENTRY"),
    "rmsnorm": ("rmsnorm", "ENTRY"),
    "swiglu": ("swiglu", "ENTRY"),
}


def get_entry(name: str) -> KernelEntry:
    """The entry of kernel `name`; ValueError listing the known names otherwise."""
    if name not in _WHERE:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_NAMES)}")
    module, attr = _WHERE[name]
    return getattr(importlib.import_module(f"dspark_core.kernels.{module}"), attr)


def mismatch_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of positions where two integer tensors differ."""
    return float((a != b).float().mean().item()) if a.numel() else 0.0
