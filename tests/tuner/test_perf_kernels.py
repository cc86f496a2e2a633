"""The per-kernel roofline for GPUs that are not here: its priors, its MoE, embedding and all-reduce terms."""

from __future__ import annotations

import pytest

from profiler.build import build_profile
from profiler.schema import GIB
from tuner.perf import Efficiency, Hardware, ModelShape, PerfModel, kernel_costs


def perf(model: str, gpu: str = "h100", **kw) -> PerfModel:
    p = build_profile(model, gpu, "chat", measure=False)
    return PerfModel(ModelShape.from_profile(p), Hardware.from_profile(p), Efficiency.prior(p.hw), **kw)


def test_gpu_priors_come_from_the_architectures_kernel_table_and_the_cpu_keeps_the_aggregate_form():
    h100 = build_profile("qwen3", "h100", "chat", measure=False).hw
    eff = Efficiency.prior(h100)
    assert eff.kernels is kernel_costs("hopper") and "hopper kernel tables" in eff.source
    floor, mem, comp = eff.kernels.gemm_of("bf16")
    assert 1e-6 < floor < 1e-5 and 0.5 < mem < 1.0 and 0.5 < comp < 1.0
    assert eff.kernels.gemm_of("fp8")[1] < mem  # FP8 decode GEMMs stream below bf16's fraction (issue 18 cause 2)
    assert Efficiency.prior(h100.model_copy(update={"arch": "cpu"})).kernels is None


def test_memory_counts_gib():
    hw = Hardware.from_profile(build_profile("qwen3", "h100", "chat", measure=False))
    assert hw.memory_bytes == 80 * GIB


def test_moe_reads_the_distinct_experts_its_tokens_touch():
    m = perf("Qwen3-30B-A3B")
    s = m.shape
    assert s.experts_touched(1) == pytest.approx(s.experts_per_token)
    assert s.experts_touched(8) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 8))
    assert s.experts_touched(4096) == pytest.approx(128, rel=1e-6)
    quant8, lm = s.weight_params_read(8)
    # the old charge min(total, active x B) read 26.8 B parameters at B = 8; the distinct experts are ~11.6 B
    assert quant8 + lm < 0.5 * min(s.params_total, s.params_active * 8)
    old_bytes = min(s.params_total, s.params_active * 8) * 2.0
    assert m.step(8, 1024, 8).seconds < old_bytes / m.hw.bandwidth  # below even a 100%-bandwidth read of those


def test_an_untied_input_embedding_is_not_read_and_the_lm_head_is_bf16():
    q8 = perf("Qwen3-8B", weights_dtype="fp8")
    quant, lm = q8.shape.weight_params_read(1)
    assert lm == q8.shape.vocab * q8.shape.hidden
    assert quant == pytest.approx(q8.shape.params_active - 2 * lm)  # neither embedding matrix is quantised
    cost = q8.step(1, 1024, 1)
    assert cost.bytes > quant * 1.0 + lm * 2.0  # the LM head streams in bf16 beside the FP8 layers


def test_allreduce_follows_the_measured_curve_and_tp_adds_it():
    k = kernel_costs("hopper")
    curve = dict(dict(k.allreduce)[2])
    for nbytes, t in curve.items():
        assert k.allreduce_s(2, nbytes) == pytest.approx(t)
    assert k.allreduce_s(2, 10_000) < k.allreduce_s(2, 1e6) < k.allreduce_s(2, 1e8)
    assert k.allreduce_s(3, 1e6) == k.allreduce_s(4, 1e6)  # an unmeasured TP size takes the next one up
    tp2 = dict(perf("Qwen3-8B", tp=2).step(8, 1024, 8).parts)
    assert tp2["allreduce"] > 0 and dict(perf("Qwen3-8B").step(8, 1024, 8).parts)["allreduce"] == 0


def test_fp8_weights_without_fp8_tensor_cores_run_weight_only_at_bf16_kernels():
    a100 = perf("Qwen3-8B", "a100", weights_dtype="fp8")
    bf16 = perf("Qwen3-8B", "a100")
    assert a100.step(1, 1024, 1).seconds < bf16.step(1, 1024, 1).seconds  # half the weight bytes
    assert a100.step(4096, 512, 8).seconds > 0.8 * bf16.step(4096, 512, 8).seconds  # no faster math


def test_step_is_monotone_in_tokens_context_and_requests():
    m = perf("Llama-3.1-8B")
    assert m.step(8, 1024, 8).seconds < m.step(8, 4096, 8).seconds
    assert m.step(8, 1024, 8).seconds < m.step(64, 1024, 64).seconds
    assert m.step(64, 1024, 8).seconds < m.step(64, 1024, 64).seconds  # a verify reads 8 requests' KV, not 64
    assert m.prefill(8 * 1024, 1024, 8).bound == "compute" and m.step(1, 1024, 1).bound == "memory"
