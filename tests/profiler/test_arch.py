"""config.json spellings across families and transformers versions read the way transformers reads them."""

from __future__ import annotations

import json

import pytest

from profiler.arch import read_config
from profiler.catalog import resolve_model
from profiler.errors import ProfileError
from profiler.model import count_params, kv_bytes_per_token, weight_bytes

from .conftest import CONFIGS


def _raw(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def test_transformers5_spelling_equals_transformers4_spelling():
    old, new = read_config(_raw("llama-3.1-8b.json")), read_config(_raw("llama-3.1-8b-transformers5.json"))
    assert old.dtype == new.dtype == "bfloat16"  # torch_dtype vs dtype
    assert new.head_dim == old.hidden // old.num_heads  # head_dim absent: derived
    assert any("head_dim derived" in n for n in new.notes)
    assert count_params(old).total == count_params(new).total


def test_head_dim_present_is_not_rederived():
    raw = _raw("qwen3-8b.json")
    assert read_config(raw).head_dim == raw["head_dim"]
    raw_gemma = _raw("gemma-2-9b.json")  # 256 != 3584 / 16
    assert read_config(raw_gemma).head_dim == raw_gemma["head_dim"] != raw_gemma["hidden_size"] // 16


def test_expert_count_spellings_agree():
    mixtral = _raw("mixtral-8x7b-v0.1.json")
    renamed = {k: v for k, v in mixtral.items() if k != "num_local_experts"} | {"num_experts": 8}
    a, b = read_config(mixtral), read_config(renamed)
    assert a.num_experts == b.num_experts == 8
    assert count_params(a).total == count_params(b).total


def test_tied_embeddings_drop_exactly_one_matrix():
    raw = _raw("qwen3-8b.json")
    tied = read_config(raw | {"tie_word_embeddings": True})
    untied = read_config(raw)
    assert count_params(untied).total - count_params(tied).total == raw["vocab_size"] * raw["hidden_size"]


def test_attention_bias_adds_exactly_the_bias_vectors():
    raw = _raw("llama-3.1-8b.json")
    h, heads, kv, layers = raw["hidden_size"], raw["num_attention_heads"], raw["num_key_value_heads"], raw[
        "num_hidden_layers"]
    hd = h // heads
    biased = count_params(read_config(raw | {"attention_bias": True})).total
    assert biased - count_params(read_config(raw)).total == layers * (heads * hd + 2 * kv * hd + h)


def test_qwen2_has_qkv_bias_and_qwen3_has_qk_norm():
    q2, q3 = read_config(_raw("qwen2.5-7b.json")), read_config(_raw("qwen3-8b.json"))
    assert q2.qkv_bias and not q2.o_bias and not q2.qk_norm
    assert q3.qk_norm and not q3.qkv_bias


def test_gqa_kv_bytes():
    raw = _raw("llama-3.1-8b.json")
    s = read_config(raw)
    expect = 2 * raw["num_hidden_layers"] * raw["num_key_value_heads"] * (raw["hidden_size"] // 32) * 2
    assert kv_bytes_per_token(s, "bf16") == expect == 2 * kv_bytes_per_token(s, "fp8")
    assert s.attention == "gqa"


def test_mla_caches_the_latent_not_the_heads():
    entry, _ = resolve_model("deepseek-v3")
    s = read_config(entry.config)
    cfg = entry.config
    assert s.attention == "mla"
    assert kv_bytes_per_token(s, "bf16") == cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg[
        "qk_rope_head_dim"]) * 2
    assert s.moe_layers[0] == cfg["first_k_dense_replace"]  # the first layers stay dense
    assert len(s.moe_layers) == cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]


def test_multimodal_config_reads_the_text_model_and_counts_the_vision_tower():
    entry, _ = resolve_model("gemma-3-12b")
    s = read_config(entry.config)
    c = count_params(s)
    assert s.hidden == entry.config["text_config"]["hidden_size"]
    assert c.vision > 0 and c.active == c.total - c.vision


def test_quantised_weight_bytes_are_ordered():
    s = read_config(_raw("qwen3-8b.json"))
    wb = {d: weight_bytes(s, d) for d in ("bf16", "fp8", "int8", "int4")}
    assert wb["bf16"] == 2 * count_params(s).total
    assert wb["bf16"] > wb["int8"] >= wb["fp8"] > wb["int4"]


@pytest.mark.parametrize("raw, needle", [
    ({"model_type": "bert", "hidden_size": 8}, "unknown architecture"),
    ({"architectures": ["FooForCausalLM"]}, "unknown architecture"),
    ({"model_type": "llama", "hidden_size": 64}, "num_hidden_layers"),
    ({"model_type": "qwen3", "hidden_size": 0, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 10, "intermediate_size": 8}, "positive integer"),
    ([1, 2], "JSON object"),
])
def test_bad_configs_are_one_line_errors(raw, needle):
    with pytest.raises(ProfileError) as e:
        read_config(raw, "x.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["Gemma-2-9B", "Gemma-3-27B", "Gemma-3-1B"])
def test_sliding_window_layers_match_transformers_layer_types(name):
    from transformers import AutoConfig

    entry, _ = resolve_model(name)
    s = read_config(entry.config)
    cfg = AutoConfig.for_model(**entry.config)
    text = getattr(cfg, "text_config", cfg)
    assert s.sliding_layers == sum(1 for t in text.layer_types if t == "sliding_attention")
    assert s.sliding_window == text.sliding_window
