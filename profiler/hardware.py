"""Hardware profile: a GPU catalogue row, or the local device detected and micro-benchmarked.

The catalogue (profiler/catalog/gpus.yaml) holds datasheet ceilings; `--gpu auto` adds what this
machine really does (GEMM throughput per dtype, device copy bandwidth) under ``hw.measured``, so
the performance model can be calibrated against the machine it runs on.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from typing import Any

from profiler.catalog import GpuEntry, gpus, resolve_gpu
from profiler.errors import ProfileError
from profiler.schema import GIB, HwProfile, Measured, PeakTflops

Progress = Callable[[str], None]  # called once per finished benchmark step


def from_entry(g: GpuEntry, count: int | None = None) -> HwProfile:
    """HwProfile from a catalogue row."""
    return HwProfile(
        name=g.name, vendor=g.vendor, arch=g.arch, sm=g.sm, count=count, memory_gb=g.memory_gb or None,
        bandwidth_gbs=g.bandwidth_gbs, peak_tflops=PeakTflops(**g.peak_tflops) if g.peak_tflops else None,
        fp8=g.fp8, num_sms=g.num_sms, l2_mb=g.l2_mb, interconnect=g.interconnect,
        interconnect_gbs=g.interconnect_gbs,
    )


def _arch_from_capability(major: int, minor: int) -> str:
    cc = major * 10 + minor
    if cc >= 100:
        return "blackwell"
    if cc >= 90:
        return "hopper"
    if cc == 89:
        return "ada"
    return "ampere"


def _cpu_facts() -> dict[str, Any]:
    """CPU model, vendor, cores and memory from /proc (Linux) or the platform module."""
    name = platform.processor() or platform.machine()
    vendor = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    low = name.lower()
    if "intel" in low:
        vendor = "intel"
    elif "amd" in low:
        vendor = "amd"
    elif platform.machine().lower() in ("aarch64", "arm64"):
        vendor = "arm"
    mem_gb = 0.0
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"name": name, "vendor": vendor, "cores": cores, "memory_gb": round(mem_gb, 1)}


def detect(measure: bool = True, progress: Progress | None = None) -> HwProfile:
    """The local accelerator (CUDA via torch), else the CPU; with microbenchmarks when ``measure``."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = torch.cuda.get_device_name(0)
        count = torch.cuda.device_count()
        try:
            hw = from_entry(resolve_gpu(name), count=count)
        except ProfileError:
            major, minor = props.major, props.minor
            hw = HwProfile(name=name, vendor="nvidia", arch=_arch_from_capability(major, minor),
                           sm=major * 10 + minor, count=count, fp8=major * 10 + minor >= 89,
                           num_sms=props.multi_processor_count, interconnect="pcie")
        hw.memory_gb = round(props.total_memory / GIB, 1)
        device = "cuda"
    else:
        hw, device = local_cpu(), "cpu"
        hw.cpu_capability = torch.backends.cpu.get_cpu_capability()  # AVX2-only CPUs verify many times slower
    if measure:
        hw.measured = microbenchmarks(device, progress)
    return hw


def local_cpu() -> HwProfile:
    """This machine's CPU: the catalogue's cpu entry with the model name, cores and memory found here."""
    facts = _cpu_facts()
    hw = from_entry(next(g for g in gpus() if g.name == "cpu"), count=1)
    hw.name = f"cpu: {facts['name']}"
    hw.vendor = facts["vendor"]
    hw.memory_gb = facts["memory_gb"]
    hw.num_sms = facts["cores"]
    return hw


def _timeit(fn: Callable[[], Any], sync: Callable[[], None], min_s: float) -> float:
    """Seconds per call: one warm-up, then repeat until ``min_s`` has passed. A warm-up that alone takes several
    times ``min_s`` is the measurement (bf16 GEMMs on a CPU without bf16 units: seconds per call, where the
    first call's set-up is noise)."""
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    if first >= 4 * min_s:
        return first
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        sync()
        dt = time.perf_counter() - t0
        if dt >= min_s:
            return dt / n


def microbenchmarks(device: str, progress: Progress | None = None, min_s: float = 0.2) -> Measured:
    """GEMM TFLOPs per dtype and copy bandwidth on ``device``; short (about a second)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n = 8192 if device == "cuda" else 1024  # square GEMM size
    out: dict[str, float] = {}
    torch.manual_seed(0)
    for dtype, key in ((torch.bfloat16, "tflops_bf16"), (torch.float16, "tflops_fp16"),
                       (torch.float32, "tflops_fp32")):
        if device == "cpu" and dtype is torch.float16:
            if progress:
                progress(f"{key}: skipped on CPU")
            continue
        a = torch.randn(n, n, device=device, dtype=dtype)  # [n, n]
        b = torch.randn(n, n, device=device, dtype=dtype)  # [n, n]
        sec = _timeit(lambda a=a, b=b: a @ b, sync, min_s)
        out[key] = round(2.0 * n**3 / sec / 1e12, 4)
        if progress:
            progress(f"{key} = {out[key]:.3g}")
    numel = (256 if device == "cuda" else 32) * 2**20  # fp32 elements: 1 GiB on GPU, 128 MiB on CPU
    src = torch.empty(numel, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    sec = _timeit(lambda: dst.copy_(src), sync, min_s)
    out["bandwidth_gbs"] = round(2.0 * numel * 4 / sec / 1e9, 2)  # read + write
    if progress:
        progress(f"copy bandwidth = {out['bandwidth_gbs']:.3g} GB/s")
    return Measured(**out)


MICROBENCH_STEPS = 4  # progress steps microbenchmarks() reports (bf16, fp16, fp32, copy)


def hardware_profile(gpu: str | None, measure: bool = True, progress: Progress | None = None) -> HwProfile | None:
    """``gpu``: a catalogue name (forgiving), 'auto' to detect this machine, or None for no hardware. 'cpu' is this
    machine's CPU (its memory and cores: a CPU has no catalogue figures to stand for it)."""
    if gpu is None:
        return None
    if gpu.strip().lower() == "auto":
        return detect(measure=measure, progress=progress)
    entry = resolve_gpu(gpu)
    if entry.name == "cpu":  # this machine's memory and cores, under the catalogue's name ('auto' also times it)
        hw = local_cpu()
        hw.name = entry.name
        return hw
    return from_entry(entry, count=None)
