"""Weight-only quantised weights in the bundled engine: each format against bf16, and FP8's _scaled_mm path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dspark_core.config import ASSETS, EngineConfig
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.quant import FORMATS, QuantLinear

# worst relative error of the dequantised weight (per-channel / per-group amax scaling of Gaussian weights)
WEIGHT_TOL = {"fp8": 0.07, "int8": 0.01, "int4": 0.2, "nvfp4": 0.25}


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantised_weight_is_close(fmt: str) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(256, 96, bias=True)
    q = QuantLinear.quantize(lin, fmt)
    w = lin.weight.detach()
    err = (q.dequantized().float() - w).norm() / w.norm()
    assert err < WEIGHT_TOL[fmt] / 2
    x = torch.randn(5, 256)
    y_ref, y = lin(x), q(x)
    assert ((y - y_ref).norm() / y_ref.norm()) < WEIGHT_TOL[fmt]
    bits = {"fp8": 8, "int8": 8, "int4": 4, "nvfp4": 4}[fmt]
    assert q.codes.numel() * q.codes.element_size() == w.numel() * bits // 8  # the codes really are that small


def test_fp8_scaled_mm_path_matches_the_reference() -> None:
    # torch._scaled_mm also runs on the CPU: the GPU path's arithmetic (dynamic per-tensor activation scale,
    # per-channel weight scale on the output) checked against the dequantising reference path
    torch.manual_seed(0)
    q = QuantLinear.quantize(nn.Linear(128, 64, bias=True).to(torch.bfloat16), "fp8")
    x = torch.randn(3, 7, 128, dtype=torch.bfloat16)
    fast, ref = q.forward_scaled_mm(x), q(x)
    assert not q.scaled_mm_ok(x)  # CPU tensors take the reference path in forward()
    assert fast.shape == ref.shape == (3, 7, 64)
    assert ((fast.float() - ref.float()).norm() / ref.float().norm()) < 0.05  # activation quantisation only


@pytest.fixture(scope="module")
def bf16_target():
    return load_model(ASSETS / "target", "cpu", "bf16")


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantised_tiny_target_agrees_with_bf16(fmt: str, bf16_target) -> None:
    model = load_model(ASSETS / "target", "cpu", fmt)
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 4 * model.arch.num_hidden_layers
    tokens = torch.randint(1, model.arch.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    ref, _ = bf16_target.forward_full(tokens)
    got, _ = model.forward_full(tokens)
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    # measured here: fp8 0.97 / 1.2%, int8 1.0 / 0.5%, int4 0.94 / 4.6%, nvfp4 0.90 / 5.8% (top-1 / logit error)
    floor, ceil = {"fp8": (0.93, 0.03), "int8": (0.97, 0.01), "int4": (0.85, 0.1), "nvfp4": (0.8, 0.12)}[fmt]
    assert agree >= floor and err <= ceil, (agree, err)


def test_an_fp8_dspark_yaml_runs_in_the_engine(tmp_path) -> None:
    from dspark_core.engine import Engine

    cfg = EngineConfig.model_validate({"device": "cpu", "weights": {"dtype": "fp8"},
                                       "drafter": {"method": "dspark", "path": None},
                                       "spec": {"block_size": 4, "head": "markov"},
                                       "sampling": {"max_new_tokens": 12}})
    gen = Engine(cfg).generate(["def add(a, b):\n    return"])
    assert len(gen.outputs[0].token_ids) == 12 and gen.stats.tau >= 1.0


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_runs_and_stays_close(kv: str) -> None:
    from dspark_core.engine import Engine

    def run(kv_dtype: str):
        cfg = EngineConfig.model_validate({"device": "cpu", "weights": {"dtype": "bf16"}, "kv": {"dtype": kv_dtype},
                                           "drafter": {"method": "plain"}, "spec": {"enabled": False},
                                           "sampling": {"max_new_tokens": 16}})
        engine = Engine(cfg)
        return engine, engine.generate(["import os\n\ndef main():\n"]).outputs[0].token_ids

    engine, toks = run(kv)
    assert engine.cache.k[0].dtype == {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kv]
    _, ref = run("auto")
    assert sum(a == b for a, b in zip(toks, ref, strict=True)) >= 12  # FP8 KV rounds; most greedy tokens agree
