"""vllm.sh keeps the tuned layout in vLLM's terms: an MLA model gets an MLA attention backend or vLLM's own
default (never FLASH_ATTN), and SGLang's DP attention becomes vLLM's data-parallel attention with expert
parallelism."""

from __future__ import annotations

import pytest

from profiler.build import build_profile
from tests.tuner.test_bundle_scripts import run_script, value
from tuner.launch import write_vllm
from tuner.space import engine_defaults
from tuner.targets import vllm_context

COMMON = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H200", "model_name": "m"}


def argv_of(tmp_path, model: str, gpu: str, **params) -> list[str]:
    profile = build_profile(model, gpu, "chat", measure=False)
    p = {**engine_defaults(), "spec.enabled": False, **params}
    write_vllm(tmp_path, vllm_context(profile, p, False, 4096), COMMON)
    code, argv, err = run_script(tmp_path / "vllm.sh", tmp_path)
    assert code == 0, err
    return argv


@pytest.mark.parametrize(("model", "backend", "want"), [
    ("deepseek-v3", "fa3", None),  # SGLang's FA3 runs MLA; vLLM's FLASH_ATTN does not: vLLM picks its MLA default
    ("deepseek-v3", "flashmla", "FLASHMLA"),
    ("deepseek-v3", "trtllm_mla", "FLASHINFER_MLA"),
    ("Llama-3.1-8B", "fa3", "FLASH_ATTN"),
    ("Llama-3.1-8B", "flashmla", None),  # an MLA kernel for a GQA model: not passed
])
def test_the_attention_backend_fits_the_models_attention(tmp_path, model, backend, want):
    argv = argv_of(tmp_path, model, "h200", **{"attention.backend": backend, "parallel.tp": 8})
    assert value(argv, "--attention-backend") == want


def test_dp_attention_is_vllms_data_parallel_attention_with_expert_parallelism(tmp_path):
    argv = argv_of(tmp_path, "deepseek-v3", "h200", **{"parallel.tp": 8, "parallel.dp_attention": True,
                                                      "parallel.ep": 8})
    assert value(argv, "--tensor-parallel-size") == "1" and value(argv, "--data-parallel-size") == "8"
    assert "--enable-expert-parallel" in argv
    # tuned without EP: vLLM's MoE stays tensor-parallel over the ranks, as SGLang's would
    moe_tp = argv_of(tmp_path, "deepseek-v3", "h200", **{"parallel.tp": 8, "parallel.dp_attention": True,
                                                        "parallel.ep": 1})
    assert value(moe_tp, "--data-parallel-size") == "8" and "--enable-expert-parallel" not in moe_tp
    # an EP group smaller than the ranks, which vLLM has not: its EP over all of them, and the script says so
    argv_of(tmp_path, "deepseek-v3", "h200", **{"parallel.tp": 8, "parallel.dp_attention": True, "parallel.ep": 2})
    assert "tuned as EP 2" in (tmp_path / "vllm.sh").read_text()
    plain = argv_of(tmp_path, "deepseek-v3", "h200", **{"parallel.tp": 8, "parallel.dp_attention": False})
    assert value(plain, "--tensor-parallel-size") == "8" and "--data-parallel-size" not in plain


@pytest.mark.parametrize("dtype", ["int8", "int4", "nvfp4"])
def test_a_format_needing_a_prequantised_checkpoint_asks_for_one(tmp_path, dtype):
    """The profiled id is the bf16 base: `--quantization compressed-tensors` on it would not load. The scripts
    refuse to start without MODEL_PATH and say why; with it they run."""
    from tuner.launch import write_sglang
    from tuner.targets import sglang_context

    profile = build_profile("Llama-3.1-70B", "a100", "math", measure=False)
    p = {**engine_defaults(), "spec.enabled": False, "weights.dtype": dtype, "parallel.tp": 2}
    write_vllm(tmp_path, vllm_context(profile, p, False, 4096), COMMON)
    write_sglang(tmp_path, sglang_context(profile, p, False, 4096), COMMON)
    for script in ("vllm.sh", "sglang.sh"):
        code, argv, err = run_script(tmp_path / script, tmp_path)
        assert code != 0 and not argv and "tuned for pre-quantised weights" in err and "MODEL_PATH" in err, err
        assert dtype in (tmp_path / script).read_text().split("\nmodel=")[0]  # the comment names the format
        code, argv, err = run_script(tmp_path / script, tmp_path, MODEL_PATH="/ckpt/llama-70b-quantised")
        assert code == 0 and "/ckpt/llama-70b-quantised" in argv, err
    fp8 = {**p, "weights.dtype": "fp8"}  # quantised at load from the bf16 checkpoint: the default model stands
    write_vllm(tmp_path, vllm_context(profile, fp8, False, 4096), COMMON)
    code, argv, _ = run_script(tmp_path / "vllm.sh", tmp_path)
    assert code == 0 and "meta-llama/Llama-3.1-70B" in argv and value(argv, "--quantization") == "fp8"


def test_the_report_says_what_the_layout_leaves_idle_and_how_to_use_it():
    from tuner.report import layout_line

    p = build_profile("Llama-3.1-70B", "a100", "math", measure=False, gpus=4)
    half = layout_line(p, {**engine_defaults(), "parallel.tp": 2, "parallel.dp": 1})
    assert half.startswith("tp 2 x 1 replica(s) = 2 of the 4 ") and "--data-parallel-size 2" in half
    assert "idle" not in layout_line(p, {**engine_defaults(), "parallel.tp": 2, "parallel.dp": 0})


def test_vllms_cpu_kv_space_never_exceeds_the_machine():
    from tuner.targets import vllm_cpu_kv_space_gib

    p = build_profile("Llama-3.1-8B", "h100", "chat", measure=False)
    params = {**engine_defaults(), "batch.max_requests": 256}
    p.hw.memory_gb = None
    assert vllm_cpu_kv_space_gib(p, params, 5376) > 100  # unknown memory: the whole pool the settings ask for
    p.hw.memory_gb = 256.0
    got = vllm_cpu_kv_space_gib(p, params, 5376)
    assert got == int(256 * 0.8 - p.model.params_total * 4 / 2**30) and got < 256


def test_an_exported_sps_table_never_runs_more_tokens_faster():
    from tuner.objective import SimulateEvaluator

    p = build_profile("Qwen3-8B", "h100", "chat", measure=False)
    ev = SimulateEvaluator(p, cost="aic")
    sps = ev.sps_table({**engine_defaults(), "spec.block_size": 7, "batch.max_requests": 64, "batch.max_tokens": 1024})
    rates = list(sps.sample_steps_per_sec)
    assert all(b <= a for a, b in zip(rates, rates[1:], strict=False)), rates
