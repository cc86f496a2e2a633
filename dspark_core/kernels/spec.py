"""What every hot-path kernel shares: its tunable config space, per-architecture defaults, the table of
tuned configs the engine loads from a bundle, and the torch/triton backend choice.

Why one place: the tuner (tuner/kernels.py) searches `KernelSpec.space`, stores winners keyed by
(kernel, GPU, shape bucket), and the engine hands those winners back here with `load_tuned`; each kernel
then asks `resolve_config` at launch time. dspark_core imports nothing from the tuner or the knowledge base,
so the table is plain data (a mapping loaded from the bundle's `kernels.json` or the engine config).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

Backend = Literal["auto", "torch", "triton"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")

# Compute capability (major) -> architecture name used in the Profile vocabulary (hw.arch).
_ARCH_BY_MAJOR: dict[int, str] = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}


@dataclass(frozen=True)
class KernelSpec:
    """A kernel's tunable knobs and the config it starts from on each GPU architecture."""

    name: str  # registry key, e.g. "rmsnorm"; also the `kernel.<name>.<knob>` parameter prefix
    space: Mapping[str, tuple[int, ...]]  # knob -> allowed values (what the tuner searches)
    defaults: Mapping[str, Mapping[str, int]]  # arch ("default", "ampere", "hopper", ...) -> full config
    doc: str  # one line: what the kernel computes

    def __post_init__(self) -> None:
        if "default" not in self.defaults:
            raise ValueError(f"kernel {self.name}: defaults need a 'default' entry")
        for arch, cfg in self.defaults.items():
            self.validate(cfg, where=f"defaults[{arch}]")

    def validate(self, config: Mapping[str, int], where: str = "config") -> None:
        """Raise ValueError naming the knob when `config` is not a full point of the space."""
        if set(config) != set(self.space):
            raise ValueError(f"kernel {self.name} {where}: knobs {sorted(config)} != {sorted(self.space)}")
        for knob, value in config.items():
            if value not in self.space[knob]:
                raise ValueError(f"kernel {self.name} {where}: {knob}={value} not in {self.space[knob]}")


# (kernel, shape bucket) -> tuned config; filled by the engine from a bundle, read at every launch.
_TUNED: dict[tuple[str, str], dict[str, int]] = {}
_LOCK = threading.Lock()
# (kernel, bucket, device) -> resolved config: launches skip validation once resolved; cleared on load
_RESOLVED: dict[tuple[str, str, str], dict[str, int]] = {}
_STATE: dict[str, str] = {"backend": os.environ.get("DSPARK_KERNEL_BACKEND", "auto")}


def set_backend(backend: str) -> None:
    """Choose the implementation for all kernels: auto (triton on CUDA, torch elsewhere), torch or triton."""
    if backend not in BACKENDS:
        raise ValueError(f"kernel backend {backend!r} is not one of {BACKENDS}")
    _STATE["backend"] = backend


def get_backend() -> str:
    return _STATE["backend"]


def use_triton(t: torch.Tensor, backend: str | None = None) -> bool:
    """True when the Triton kernel should run for tensor `t`.

    `auto` picks Triton only on CUDA; `triton` forces it (on CPU it runs in Triton's interpreter, which is
    how the tests check the kernels); `torch` forces the reference.
    """
    choice = backend or _STATE["backend"]
    if choice not in BACKENDS:
        raise ValueError(f"kernel backend {choice!r} is not one of {BACKENDS}")
    if choice == "torch":
        return False
    if choice == "triton":
        return True
    return t.is_cuda


def gpu_arch(device: torch.device | str | None = None) -> str:
    """Architecture name of a CUDA device ("hopper", ...) or "cpu"."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    major, _ = torch.cuda.get_device_capability(dev)
    if major == 8 and torch.cuda.get_device_capability(dev)[1] == 9:
        return "ada"
    return _ARCH_BY_MAJOR.get(major, "default")


def load_tuned(table: Mapping[str, Mapping[str, Mapping[str, int]]]) -> None:
    """Install tuned configs `{kernel: {bucket: config}}` (replaces earlier entries for the same keys)."""
    with _LOCK:
        for kernel, buckets in table.items():
            for bucket, cfg in buckets.items():
                _TUNED[(kernel, bucket)] = {k: int(v) for k, v in cfg.items()}
        _RESOLVED.clear()


def gpu_key(name: str) -> str:
    """Normalised GPU name keying tuned configs: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-") or "unknown"


def load_tuned_file(path: str | Path, device: torch.device | str | None = None) -> bool:
    """Install a bundle's kernels.json (`{"gpu": key, "configs": {kernel: {bucket: config}}}`).

    Returns False (and installs nothing) when the bundle was tuned on another GPU model than `device`
    (configs tuned elsewhere would only cost speed, but the defaults are the better guess). ValueError
    with the file name when the file is not such a table.
    """
    try:
        data = json.loads(Path(path).read_text())
        gpu, configs = str(data["gpu"]), data["configs"]
        table = {str(k): {str(b): {str(n): int(v) for n, v in c.items()} for b, c in bs.items()}
                 for k, bs in configs.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a kernels.json table ({type(e).__name__}: {e}); re-export the bundle") \
            from None
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and gpu_key(torch.cuda.get_device_name(dev)) != gpu:
        return False
    load_tuned(table)
    return True


def clear_tuned() -> None:
    with _LOCK:
        _TUNED.clear()
        _RESOLVED.clear()


def tuned_table() -> dict[str, dict[str, dict[str, int]]]:
    """The installed tuned configs as `{kernel: {bucket: config}}` (a copy)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    with _LOCK:
        for (kernel, bucket), cfg in _TUNED.items():
            out.setdefault(kernel, {})[bucket] = dict(cfg)
    return out


ANY_BUCKET = "*"  # tuned-table bucket that applies to every shape (the engine config's kernel.<name>.<knob>)


def resolve_config(spec: KernelSpec, bucket: str, device: torch.device | str | None,
                   override: Mapping[str, int] | None = None) -> dict[str, int]:
    """Config for one launch: explicit override > tuned (kernel, bucket) > tuned (kernel, "*") laid over
    the arch default > arch default > generic default.

    A tuned entry that is not a valid point of the current space (an older bundle) is ignored, so a stale
    bundle costs speed, never correctness. "*" entries may name only some knobs.
    """
    if override is not None:
        spec.validate(override, where="override")
        return dict(override)
    key = (spec.name, bucket, str(device))
    hit = _RESOLVED.get(key)
    if hit is None:
        hit = _RESOLVED[key] = _resolve(spec, bucket, device)
    return dict(hit)


def _resolve(spec: KernelSpec, bucket: str, device: torch.device | str | None) -> dict[str, int]:
    base = dict(spec.defaults.get(gpu_arch(device), spec.defaults["default"]))
    for key, partial in ((bucket, False), (ANY_BUCKET, True)):
        tuned = _TUNED.get((spec.name, key))
        if tuned is None:
            continue
        cfg = {**base, **tuned} if partial else dict(tuned)
        try:
            spec.validate(cfg, where=f"tuned[{key}]")
            return cfg
        except ValueError:
            continue
    return base


def load_engine_params(kernel_section: Mapping[str, Mapping[str, int]]) -> None:
    """Install the engine config's `kernel.<name>.<knob>` values (dspark.yaml `kernel:`) for every shape."""
    load_tuned({name: {ANY_BUCKET: dict(knobs)} for name, knobs in kernel_section.items()})


def pow2_ceil(n: int) -> int:
    """Smallest power of two >= n (n >= 1); the shape bucket unit."""
    return 1 << max(0, int(n) - 1).bit_length()


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, on_cpu: bool, **kwargs: Any) -> None:
    """Launch a @triton.jit kernel; CPU tensors need Triton's interpreter.

    The interpreter is chosen when triton is imported (TRITON_INTERPRET=1 must be set before that, as the
    kernel tests do), so a CPU launch without it is refused with one clear line instead of a crash inside
    the compiler. num_warps/num_stages mean nothing to the interpreter and are dropped there.
    """
    if _is_interpreted(kernel):
        kwargs.pop("num_warps", None)
        kwargs.pop("num_stages", None)
    elif on_cpu:
        raise RuntimeError("Triton kernels on CPU tensors run only in Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before importing triton, or use the torch backend")
    kernel[grid](*args, **kwargs)


def _is_interpreted(kernel: Any) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
