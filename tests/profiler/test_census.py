"""Operator census: a generated ONNX file, the exported decoder layers, the shipped census, the cache."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from profiler.arch import read_config
from profiler.catalog import resolve_model
from profiler.census import _shipped, census, census_onnx_file, compute_census, count_ops, export_layer
from profiler.errors import ProfileError


def _spec(name: str):
    entry, _ = resolve_model(name)
    return read_config(entry.config, entry.name)


def _act_nodes(act: str) -> list:
    """gate -> activation output 'a': SiLU as gate * Sigmoid(gate), GELU in torch's erf expansion."""
    if act == "silu":
        return [helper.make_node("Sigmoid", ["gate"], ["sg"]), helper.make_node("Mul", ["gate", "sg"], ["a"])]
    return [helper.make_node("Div", ["gate", "sqrt2"], ["gd"]), helper.make_node("Erf", ["gd"], ["ge"]),
            helper.make_node("Add", ["ge", "one"], ["g1"]), helper.make_node("Mul", ["gate", "g1"], ["gm"]),
            helper.make_node("Mul", ["gm", "half"], ["a"])]


def _handmade_onnx(path: Path, act: str = "silu") -> None:
    """x -> RMSNorm -> gate/up MatMuls -> act(gate) * up -> down; plus a residual Add feeding a norm."""
    import numpy as np

    rng = np.random.default_rng(0)
    w = {n: numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n)
         for n, s in (("wg", (8, 16)), ("wu", (8, 16)), ("wd", (16, 8)), ("g", (8,)))}
    two = numpy_helper.from_array(np.array(2.0, dtype="float32"), "two")
    eps = numpy_helper.from_array(np.array(1e-6, dtype="float32"), "eps")
    consts = [numpy_helper.from_array(np.array(v, dtype="float32"), n)
              for n, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["xn0"]),
        helper.make_node("Mul", ["xn0", "g"], ["xn"]),
        helper.make_node("MatMul", ["xn", "wg"], ["gate"]),
        helper.make_node("MatMul", ["xn", "wu"], ["up"]),
        *_act_nodes(act),
        helper.make_node("Mul", ["a", "up"], ["act"]),
        helper.make_node("MatMul", ["act", "wd"], ["down"]),
        helper.make_node("Add", ["x", "down"], ["h"]),
        helper.make_node("Pow", ["h", "two"], ["sq2"]),
        helper.make_node("ReduceMean", ["sq2"], ["ms2"], axes=[-1], keepdims=1),
        helper.make_node("Identity", ["ms2"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])],
                              initializer=[*w.values(), two, eps, *consts])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("act, glu, other", [("silu", "swiglu", "geglu"), ("gelu", "geglu", "swiglu")])
def test_census_of_a_generated_onnx_file(tmp_path, act, glu, other):
    path = tmp_path / "mlp.onnx"
    _handmade_onnx(path, act)
    ops = census_onnx_file(path)
    assert ops["rmsnorm"] == 2
    assert ops[glu] == 1 and ops["gate_up_proj"] == 1 and ops[other] == 0
    assert ops["residual_add_norm"] == 1
    assert ops["rope"] == ops["softmax"] == ops["moe_routing"] == ops["qkv_proj"] == 0


@pytest.mark.parametrize("name", ["Qwen3-8B", "Qwen2.5-7B", "Gemma-2-9B", "Qwen3-30B-A3B", "DeepSeek-V3"])
def test_exported_layer_census_follows_the_architecture(tmp_path, name):
    spec = _spec(name)
    path = tmp_path / "layer.onnx"
    export_layer(spec, path)
    ops = count_ops(onnx.load(str(path)))
    qk_norms = 2 if spec.qk_norm else 0
    mla_norms = (1 if spec.q_lora_rank else 0) + 1 if spec.is_mla else 0
    assert ops["rmsnorm"] == spec.norms_per_layer + qk_norms + mla_norms
    glu = "swiglu" if spec.act == "silu" else "geglu"
    assert ops[glu] == 1 + (1 if spec.shared_intermediate else 0)  # routed experts run as one grouped GEMM
    assert ops["gate_up_proj"] == ops[glu]
    assert ops["rope"] == 2  # q and k
    assert ops["qkv_proj"] == 1  # q/k/v (MLA: q_a + kv_a) read one input: one fused GEMM
    assert ops["attention"] == 1
    assert ops["residual_add_norm"] == 1
    assert ops["moe_routing"] == int(spec.is_moe)
    router_softmax = int(spec.is_moe and not spec.family.startswith("deepseek"))  # DeepSeek scores by sigmoid
    assert ops["softmax"] == 1 + router_softmax


@pytest.mark.parametrize("name", ["Qwen3-8B", "Mixtral-8x7B-v0.1", "Gemma-3-27B"])
def test_shipped_census_matches_a_fresh_export(name):
    spec = _spec(name)
    assert _shipped()[spec.signature()] == compute_census(spec)


def test_census_is_cached_per_signature(tmp_path):
    spec = _spec("Qwen2.5-0.5B")
    first, src1 = census(spec, refresh=True)
    second, src2 = census(spec)
    assert src1 == "export" and src2 == "cache" and first == second
    same_structure = _spec("Qwen2.5-72B")  # another size, same signature: no new export
    assert census(same_structure) == (first, "cache")


def test_unreadable_onnx_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    with pytest.raises(ProfileError) as e:
        census_onnx_file(bad)
    assert "not a readable ONNX model" in str(e.value)
