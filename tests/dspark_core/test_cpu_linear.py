"""The CPU linear kernel choice (`weights.cpu_kernel`, dspark_core/modeling/cpu_linear.py): what each choice runs,
and one clear line where oneDNN cannot pack the dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dspark_core.config import ASSETS, EngineConfig
from dspark_core.errors import DSparkError
from dspark_core.modeling import cpu_linear
from dspark_core.modeling.checkpoint import load_model


def test_torch_keeps_nn_linear_and_auto_packs_once_for_every_engine_sharing_the_target():
    model = load_model(ASSETS / "target", "cpu", "fp32")
    assert cpu_linear.apply_kernel(model, "torch") == "torch" and type(model.lm_head) is nn.Linear
    if not cpu_linear.supported(torch.float32):
        assert cpu_linear.apply_kernel(model, "auto") == "torch"
        return
    x = torch.randn(3, 9, model.arch.hidden_size)  # [B, T, H]: a verify block of 3 rows
    want = model.layers[0].gate_up(x)
    assert cpu_linear.apply_kernel(model, "auto") == "onednn"
    assert isinstance(model.layers[0].gate_up, cpu_linear.PackedLinear)
    assert torch.allclose(model.layers[0].gate_up(x), want, atol=1e-5)
    assert cpu_linear.apply_kernel(model, "onednn") == "onednn"  # a second engine on the same (packed) target


def test_onednn_where_this_cpu_cannot_pack_the_dtype_is_one_line(monkeypatch):
    from dspark_core.engine import Engine

    monkeypatch.setattr(cpu_linear, "supported", lambda dtype: False)
    cfg = EngineConfig(device="cpu")
    cfg.weights.cpu_kernel = "onednn"
    with pytest.raises(DSparkError, match=r"cpu_kernel onednn: oneDNN does not pack float32 .*use auto or torch"):
        Engine(cfg)
    cfg.weights.cpu_kernel = "auto"  # auto falls back to nn.Linear
    assert Engine(cfg).linear_kernel == "torch"
