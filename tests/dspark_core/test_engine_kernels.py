"""The engine runs its hot path through the Triton kernels when they are selected (interpreter on CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_core.config import EngineConfig, load_config, save_config
from dspark_core.engine import Engine
from dspark_core.kernels import spec as kspec
from dspark_core.verification.sampling import SamplingParams


@pytest.fixture
def triton_backend():
    kspec.set_backend("triton")
    yield
    kspec.set_backend("auto")
    kspec.clear_tuned()


def test_forward_with_kernels_matches_torch(tiny_target, triton_backend):
    tokens = torch.tensor([[5, 17, 99, 3, 250, 41]])
    with torch.no_grad():
        kspec.set_backend("torch")
        ref = tiny_target.forward_full(tokens, ())[0]
        kspec.set_backend("triton")
        got = tiny_target.forward_full(tokens, ())[0]
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_greedy_generation_identical_with_kernels(tiny_target, triton_backend):
    sp = SamplingParams(max_new_tokens=6)
    cfg = EngineConfig()
    cfg.drafter.method = "ngram"
    cfg.spec.block_size = 3
    kspec.set_backend("torch")
    ref = Engine(cfg, target=tiny_target).generate([[5, 17, 99, 3, 5, 17]], sp).outputs[0].token_ids
    kspec.set_backend("triton")
    got = Engine(cfg, target=tiny_target).generate([[5, 17, 99, 3, 5, 17]], sp).outputs[0].token_ids
    assert got == ref


def test_bundle_kernel_file_is_loaded_relative_to_the_config(tmp_path, tiny_target):
    cfg = EngineConfig(kernel={"rmsnorm": {"num_warps": 2}}, kernel_file="kernels.json")
    (tmp_path / "kernels.json").write_text(json.dumps({"gpu": "cpu", "configs": {"swiglu": {"*": {"BLOCK": 64}}}}))
    save_config(cfg, tmp_path / "dspark.yaml")
    loaded = load_config(tmp_path / "dspark.yaml")
    assert loaded.kernel_file == str(tmp_path / "kernels.json")
    Engine(loaded, target=tiny_target)
    table = kspec.tuned_table()
    assert "swiglu" in table and "rmsnorm" in table
    kspec.clear_tuned()
