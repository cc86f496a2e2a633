"""Attention over the KV cache on an AVX512-BF16 CPU: a kernel of our own (cpu_attention.c) where SDPA's is slow.

At 8 requests x 1 token SDPA's CPU flash kernel (bf16, the GQA heads folded, modeling/model.py `attend`) took 330 us
a layer of SmolLM2-135M's 29 ms step: a third of it, for 1.6 MB of keys and values (RESULTS.md, "Attention at 8
requests"). Its tasks are one (row, head) pair of a few query rows each, and it packs small GEMM blocks per task.
Decode and verify attention is a matrix-vector product per key; cpu_attention.c does it with `vdpbf16ps`, a task per
(row, KV head) for all the group's query heads and positions, each key and value row read once.

* Where: bfloat16 on a CPU whose compiler flags (`-march=native`) include AVX512-BF16, head dims a multiple of 32,
  and queries that each attend a prefix of their row's keys (`lens`: decode and verify steps; not prefill's causal
  mask over a packed prompt). Anything else, or a failed build, runs SDPA as before.
* Built once per source, compiler and CPU with the system C compiler into `$XDG_CACHE_HOME/dspark-tune/kernels/`
  (about 0.5 s), linked against the OpenMP runtime PyTorch already loaded (libgomp), and called through ctypes by
  the custom op `dspark::cpu_attention`, an opaque extern call inside compiled graphs (as `dspark::packed_linear`).
* `DSPARK_CPU_ATTENTION=sdpa` turns it off (benchmarks compare the two with `use`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_attention.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 120  # a compiler that hangs leaves SDPA in place
MAX_TOKENS = 17  # query tokens a row it takes: decode and verify steps (a long prompt's prefill stays on SDPA, whose
# blocked GEMMs reuse each key across queries; this kernel holds every query's scores at once)

_lib: ctypes.CDLL | None = None
_ready = False  # the kernel loaded (a plain bool: compiled code reads it while tracing)
_tried = False
_enabled = os.environ.get("DSPARK_CPU_ATTENTION", "").lower() != "sdpa"
why = ""  # why the kernel is not in use ("" when it is, or before `load`)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dspark-tune" / "kernels"


def _build(cc: str) -> Path:
    """The shared library for this source, compiler and CPU: built once into the cache folder (atomically)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    cpu = Path("/proc/cpuinfo").read_text()[:100_000] if Path("/proc/cpuinfo").is_file() else ""
    flags = next((line for line in cpu.splitlines() if line.startswith("flags")), "")
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version, flags]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_attention-{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
        if r.returncode != 0:
            raise RuntimeError((r.stderr.strip().splitlines() or ["no output"])[-1][:200])
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


def load() -> bool:
    """Build (or find) and load the kernel once; whether it is usable. Call outside compiled code: a graph traced
    before the kernel loads runs SDPA."""
    global _lib, _ready, _tried, why
    if _tried:
        return _ready
    _tried = True
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not _enabled:
        why = "DSPARK_CPU_ATTENTION=sdpa"
    elif not cc:
        why = "no C compiler (gcc / cc / $CC)"
    else:
        try:
            lib = ctypes.CDLL(str(_build(cc)))
            fn = lib.dspark_attention_bf16
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6 + [ctypes.c_void_p] * 3 + [ctypes.c_float,
                                                                                                ctypes.c_int]
            _lib, why = lib, ""
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            why = f"cpu_attention.c did not build or load: {e}"
    _ready = _lib is not None
    return _ready


def label(device: torch.device, dtype: torch.dtype) -> str:
    """Which attention a model on `device` in `dtype` runs over its cache, for the start-up line."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return "SDPA attention"
    return "our bf16 attention kernel" if load() else f"SDPA attention ({why})"


def use(on: bool) -> bool:
    """Turn the kernel on or off for eager steps and graphs traced from now on (a compiled graph guards on it, so one
    of each runs as the switch says): benchmarks' side-by-side runs. Whether it is on."""
    global _enabled, _tried, _ready
    _enabled = on
    if on and _lib is None:
        _tried = False
        return load()
    _ready = on and _lib is not None
    return _ready


def takes(q: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether `cpu_attention` runs this attention: the kernel loaded (eager code loads it on first use), bf16 on a
    CPU, head dims it handles, a step of up to MAX_TOKENS tokens a row."""
    if not (q.shape[2] <= MAX_TOKENS and q.dtype == torch.bfloat16 and keys.dtype == torch.bfloat16
            and q.device.type == "cpu" and q.shape[-1] % 32 == 0 and q.shape[-1] <= 256):
        return False  # never a compiler run for a model the kernel would not serve (fp32, a GPU)
    if not _tried and not torch.compiler.is_compiling():
        load()
    return _ready


@torch.library.custom_op("dspark::cpu_attention", mutates_args=())
def cpu_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """q [B, nh, T, hd] over keys / vals [B, nkv, Lk, hd] (bf16, last dim contiguous), query (b, t) attending its
    row's first lens[b, t] keys -> [B, nh, T, hd]; lens[b, t] = 0 marks a padding query of a ragged step, skipped
    (its output 0)."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    vals = vals if vals.stride(-1) == 1 else vals.contiguous()
    lens = lens.to(torch.int64).contiguous()
    b, nh, t, hd = q.shape
    out = torch.empty(b, nh, t, hd, dtype=q.dtype)
    strides = [(ctypes.c_int64 * 4)(*x.stride()) for x in (q, keys, vals)]
    rc = _lib.dspark_attention_bf16(q.data_ptr(), keys.data_ptr(), vals.data_ptr(), lens.data_ptr(), out.data_ptr(),
                                    b, nh, keys.shape[1], t, hd, keys.shape[2], *strides, hd ** -0.5,
                                    torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"cpu_attention.c refused q {tuple(q.shape)}, keys {tuple(keys.shape)} (code {rc})")
    return out


@cpu_attention.register_fake
def _(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape)
