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
    argv = argv_of(tmp_path, "deepseek-v3", "h200", **{"parallel.tp": 8, "parallel.dp_attention": True})
    assert value(argv, "--tensor-parallel-size") == "1" and value(argv, "--data-parallel-size") == "8"
    assert "--enable-expert-parallel" in argv
    plain = argv_of(tmp_path, "deepseek-v3", "h200", **{"parallel.tp": 8, "parallel.dp_attention": False})
    assert value(plain, "--tensor-parallel-size") == "8" and "--data-parallel-size" not in plain
