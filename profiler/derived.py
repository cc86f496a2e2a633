"""``derived.*``: what bounds decode on this hardware at the workload's batch, and what fits.

Roofline: one decode step of B tokens at context L costs FLOPs = B * f(L) and bytes = weights
touched + B * L * KV bytes; it is compute-bound when FLOPs / peak > bytes / bandwidth. Memory
fit: weights plus the KV of every concurrent request at its mean full length must fit in 90 % of
device memory (vLLM's default gpu_memory_utilization), split evenly over TP ranks.
"""

from __future__ import annotations

from profiler.arch import ArchSpec
from profiler.model import decode_step, kv_bytes_per_token, weight_bytes
from profiler.schema import GIB, Derived, HwProfile, WorkloadProfile

MEMORY_UTILIZATION = 0.9  # usable fraction of device memory
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)  # TP sizes considered (beyond 8: multi-node)


def _ceilings(hw: HwProfile) -> tuple[float | None, float | None]:
    """(FLOP/s, bytes/s): the datasheet's bf16 when known, else what was measured here (on a CPU the faster of
    bf16 and fp32, the dtype the engine would run)."""
    peak = hw.peak_tflops.bf16 if hw.peak_tflops and hw.peak_tflops.bf16 else None
    bw = hw.bandwidth_gbs
    if hw.measured:
        if hw.arch == "cpu":  # the engine runs the faster of the two here: bf16 without AVX512-BF16 is emulated
            peak = peak or max(hw.measured.tflops_bf16 or 0.0, hw.measured.tflops_fp32 or 0.0) or None
        else:
            peak = peak or hw.measured.tflops_bf16 or hw.measured.tflops_fp32
        bw = bw or hw.measured.bandwidth_gbs
    return (peak * 1e12 if peak else None), (bw * 1e9 if bw else None)


def context_len(wl: WorkloadProfile) -> float:
    """Mean context a decoded token attends over: the prompt plus half the output."""
    p = wl.prompt_len.mean if wl.prompt_len and wl.prompt_len.mean else 0.0
    o = wl.output_len.mean if wl.output_len and wl.output_len.mean else 0.0
    return p + o / 2.0


def ridge_batch(spec: ArchSpec, peak: float, bw: float, limit: float = 1 << 20) -> float | None:
    """Tokens per step at which compute time reaches weight-streaming time (bisection; None if never).

    Weights-only roofline: KV reads scale with requests, not tokens, so extra tokens of one request
    (speculative verify tokens) move a step towards this point without adding KV bytes.
    """
    def excess(b: float) -> float:
        flops, nbytes = decode_step(spec, b, 0.0)
        return flops / peak - nbytes / bw

    lo, hi = 1.0, 1.0
    if excess(lo) >= 0:
        return 1.0
    while excess(hi) < 0:
        hi *= 2
        if hi > limit:
            return None
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if excess(mid) >= 0 else (mid, hi)
    return round(hi, 1)


def verify_budget(spec: ArchSpec, peak: float, bw: float, batch: int, ctx: float, cap: float = 64.0) -> float:
    """Draft tokens per request a decode step of `batch` requests at context `ctx` can verify while memory still
    bounds it: the largest lambda with batch x (1 + lambda) tokens' FLOPs at `peak` <= (the weights those tokens
    touch + every request's KV, read once per request) at `bw`, by bisection; 0 when decode is compute-bound."""
    b = max(1, batch)
    per_token, _ = decode_step(spec, 1, ctx)
    _, kv_and_w = decode_step(spec, b, ctx)
    _, w_only = decode_step(spec, b, 0.0)
    kv = kv_and_w - w_only  # the batch's KV bytes, independent of how many tokens each request verifies

    def excess(t: float) -> float:  # t = 1 + lambda tokens per request
        _, w = decode_step(spec, b * t, 0.0)
        return b * t * per_token / peak - (w + kv) / bw

    if excess(1.0) >= 0:
        return 0.0
    if excess(1.0 + cap) < 0:
        return cap
    lo, hi = 1.0, 1.0 + cap
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    return round(lo - 1.0, 1)


def min_tp(need_bytes: float, memory_gb: float) -> int | None:
    usable = memory_gb * GIB * MEMORY_UTILIZATION
    return next((tp for tp in TP_SIZES if need_bytes / tp <= usable), None)


def _sglang(d: Derived, hw: HwProfile) -> None:
    """SGLang's own memory defaults for this GPU (catalog/sglang_defaults.yaml, read off SGLang's resolution) at the
    smallest TP 8-bit weights fit in, which is where a plan's TP starts."""
    from profiler.catalog import resolve_gpu, sglang_defaults
    from profiler.errors import ProfileError

    try:
        name = resolve_gpu(hw.name).name if hw.name else ""
    except ProfileError:  # a measured or unknown device: SGLang's defaults are not pinned for it
        return
    row = sglang_defaults().get(name)
    if not row:
        return
    tp = next((t for t in (1, 2, 4, 8) if t >= (d.min_tp_fp8 or 1)), 8)
    got = row.get(f"tp{tp}") or {}
    d.sglang_tp = tp
    d.sglang_static_fraction = got.get("mem_fraction_static")
    d.sglang_chunked_prefill = got.get("chunked_prefill_size")
    d.sglang_graph_bs = got.get("cuda_graph_max_bs")


def derive(spec: ArchSpec, hw: HwProfile | None, wl: WorkloadProfile) -> Derived:
    """Fill what the model, hardware and workload together determine."""
    batch = int(wl.concurrency or 1)
    ctx = context_len(wl)
    d = Derived(decode_batch=batch, decode_context=round(ctx, 1))
    flops, nbytes = decode_step(spec, batch, ctx)
    d.arith_intensity = round(flops / nbytes, 2)
    if hw is None:
        return d
    peak, bw = _ceilings(hw)
    if hw.memory_gb:
        tokens = batch * ((wl.prompt_len.mean or 0) if wl.prompt_len else 0)
        tokens += batch * ((wl.output_len.mean or 0) if wl.output_len else 0)
        kv = tokens * kv_bytes_per_token(spec, "bf16")
        d.min_tp_bf16 = min_tp(weight_bytes(spec, "bf16") + kv, hw.memory_gb)
        d.min_tp_fp8 = min_tp(weight_bytes(spec, "fp8") + kv, hw.memory_gb)
        d.min_tp_int4 = min_tp(weight_bytes(spec, "int4") + kv, hw.memory_gb)
        d.weights_fit_bf16 = d.min_tp_bf16 == 1
        d.weights_fit_fp8 = d.min_tp_fp8 == 1
        if d.min_tp_bf16:
            free = d.min_tp_bf16 * hw.memory_gb * GIB * MEMORY_UTILIZATION - weight_bytes(spec, "bf16")
            d.kv_capacity_tokens = float(int(free / kv_bytes_per_token(spec, "bf16")))
    _sglang(d, hw)
    if peak and bw:
        t_compute, t_memory = flops / peak, nbytes / bw
        d.decode_bound = "compute" if t_compute > t_memory else "memory"
        d.ridge_intensity = round(peak / bw, 1)
        d.ridge_batch = ridge_batch(spec, peak, bw)
        d.verify_budget = verify_budget(spec, peak, bw, batch, ctx)
        tp = d.min_tp_bf16 or 1  # ideal TP split: FLOPs and bytes both divide over the ranks
        d.decode_step_ms = round(max(t_compute, t_memory) / tp * 1e3, 3)
    return d
