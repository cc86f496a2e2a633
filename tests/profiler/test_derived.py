"""Roofline and memory-fit figures are consistent with their own definitions."""

from __future__ import annotations

import pytest

from profiler.arch import read_config
from profiler.catalog import resolve_gpu, resolve_model
from profiler.derived import MEMORY_UTILIZATION, context_len, derive
from profiler.hardware import from_entry
from profiler.model import (
    arithmetic_intensity,
    count_params,
    decode_step,
    flops_per_token,
    kv_bytes_per_token,
    weight_bytes,
    weights_touched_bytes,
)
from profiler.workload import preset_profile


def _spec(name: str):
    entry, _ = resolve_model(name)
    return read_config(entry.config, entry.name)


def test_small_batch_decode_is_memory_bound_and_the_ridge_is_where_times_meet():
    spec, hw, wl = _spec("Qwen3-8B"), from_entry(resolve_gpu("h100")), preset_profile("chat")
    wl.concurrency = 1
    d = derive(spec, hw, wl)
    assert d.decode_bound == "memory"
    peak, bw = hw.peak_tflops.bf16 * 1e12, hw.bandwidth_gbs * 1e9
    flops, nbytes = decode_step(spec, d.ridge_batch, 0.0)
    assert flops / peak == pytest.approx(nbytes / bw, rel=1e-3)
    assert d.ridge_intensity == pytest.approx(peak / bw, rel=1e-3)


def test_attention_term_grows_linearly_with_context():
    spec = _spec("Llama-3.1-8B")
    f0, f1, f2 = (flops_per_token(spec, ctx) for ctx in (0, 1000, 2000))
    assert f0 == 2 * count_params(spec).linear_active
    assert f2 - f1 == pytest.approx(f1 - f0) and f1 > f0


def test_sliding_window_caps_the_attention_term():
    spec = _spec("Gemma-2-9B")
    w = spec.sliding_window
    slope_short = flops_per_token(spec, w) - flops_per_token(spec, w - 1000)
    slope_long = flops_per_token(spec, w + 2000) - flops_per_token(spec, w + 1000)
    assert slope_long == pytest.approx(slope_short * (spec.num_layers - spec.sliding_layers) / spec.num_layers)


def test_moe_reads_more_experts_as_the_batch_grows():
    spec = _spec("Qwen3-30B-A3B")
    one, many = weights_touched_bytes(spec, 1), weights_touched_bytes(spec, 4096)
    assert one < many <= weight_bytes(spec, "bf16") * 1.0001
    assert arithmetic_intensity(spec, 64, 1000) > arithmetic_intensity(spec, 1, 1000)


@pytest.mark.parametrize("name, gpu", [("Llama-3.1-405B", "h100"), ("Qwen3-8B", "l4"), ("DeepSeek-V3", "h200")])
def test_min_tp_is_the_smallest_power_of_two_that_fits(name, gpu):
    spec, hw, wl = _spec(name), from_entry(resolve_gpu(gpu)), preset_profile("chat")
    d = derive(spec, hw, wl)
    kv = wl.concurrency * (wl.prompt_len.mean + wl.output_len.mean) * kv_bytes_per_token(spec, "bf16")
    usable = hw.memory_gb * 1e9 * MEMORY_UTILIZATION
    for dtype, tp in (("bf16", d.min_tp_bf16), ("fp8", d.min_tp_fp8), ("int4", d.min_tp_int4)):
        need = weight_bytes(spec, dtype) + kv
        assert tp is not None and need / tp <= usable
        assert tp == 1 or need / (tp // 2) > usable
    assert d.weights_fit_bf16 == (d.min_tp_bf16 == 1)
    assert d.decode_context == pytest.approx(context_len(wl))
