"""The model and GPU catalogues of issue 37: vendored configs, the new models' counts, KV layouts, MTP modules,
census signatures, and the new GPUs' sourced figures."""

from __future__ import annotations

import hashlib

import onnx  # noqa: F401  # onnx and torch imported once at collection: the census tests time the export only
import pytest
import yaml

import profiler.layer  # noqa: F401
from profiler.arch import read_config
from profiler.catalog import CATALOG_DIR, gpus, models, resolve_model
from profiler.model import count_params, kv_bytes_per_token

SOURCES = yaml.safe_load((CATALOG_DIR / "configs" / "SOURCES.yaml").read_text())
VENDORED = [m for m in models() if m.config_file]


def _spec(name: str):
    entry, _ = resolve_model(name)
    return read_config(entry.config, entry.name)


@pytest.mark.parametrize("row", SOURCES["files"], ids=lambda r: r["file"])
def test_vendored_configs_are_the_recorded_bytes(row):
    data = (CATALOG_DIR / "configs" / row["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == row["sha256"], row["file"]
    assert row["origin"]


def test_every_vendored_config_is_listed_and_used():
    listed = {r["file"] for r in SOURCES["files"]}
    on_disk = {p.name for p in (CATALOG_DIR / "configs").glob("*.json")}
    used = {m.config_file.split("/", 1)[1] for m in VENDORED}
    assert listed == on_disk == used
    assert {u["model"] for u in SOURCES["unavailable"]} == {"GLM-4.5", "GLM-4.6"}


@pytest.mark.parametrize("entry", VENDORED, ids=lambda m: m.name)
def test_vendored_models_match_the_published_totals(entry):
    """Total (and active) parameters within 1 %, or the row's stated tolerance, of the figures its source names."""
    c = count_params(read_config(entry.config, entry.name))
    pub = entry.published
    assert pub.source and entry.source.startswith("https://huggingface.co/")
    total = c.total - (c.vision if pub.total_excludes_vision else 0)
    assert abs(total / pub.params_total - 1) <= max(0.01, pub.tolerance or 0), total
    if pub.params_active is not None:
        active = c.active - (c.embedding if pub.active_excludes_input_embedding else 0)
        unit = 0.05e9 if pub.params_active < 10e9 else 0.5e9  # half a unit of the last published digit (3.6B, 49B)
        assert abs(active - pub.params_active) <= max((pub.tolerance or 0.01) * pub.params_active, unit), active


# transformers 5.25 on the meta device, language model only (the vision tower counted apart), counted when the
# readers were written and re-checked since; + the routers' e_score_correction_bias, which the checkpoints ship
# and transformers keeps as a buffer (DeepSeek / Kimi: MoE layers x routed experts)
TRANSFORMERS_TEXT = {
    "DeepSeek-V4-Flash": (284_332_230_231, 43 * 256 - 3 * 256),  # 3 hash-routed layers have no score bias
    "DeepSeek-V4-Pro": (1_572_997_179_491, 61 * 384 - 3 * 384),
    "DeepSeek-R1": (671_026_404_352, 58 * 256),
    "Kimi-K2-Instruct": (1_026_408_209_408, 60 * 384),
    "Kimi-K2.5": (1_026_408_209_408, 60 * 384),
    "Kimi-K2.6": (1_026_408_209_408, 60 * 384),
    "gpt-oss-20b": (20_914_757_184, 0), "gpt-oss-120b": (116_829_156_672, 0),
    "Llama-4-Scout-17B-16E": (107_769_861_120, 0), "Llama-4-Maverick-17B-128E": (400_711_848_960, 0),
    "Gemma-4-26B-A4B": (25_233_141_760, 0), "Gemma-4-31B": (30_697_345_280, 0),
    "Qwen3-Next-80B-A3B": (79_674_391_296, 0),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_TEXT))
def test_text_models_equal_transformers_count(name):
    total, bias = TRANSFORMERS_TEXT[name]
    c = count_params(_spec(name))
    assert c.total - c.vision == total + bias


def test_every_vendored_model_is_in_the_transformers_table():
    assert {m.name for m in VENDORED} == set(TRANSFORMERS_TEXT)


@pytest.mark.parametrize("name, kv_bytes", [
    ("Qwen3-Next-80B-A3B", 12 * 2 * 2 * 256 * 2),  # 12 gated-attention layers, 2 KV heads x 256; 36 DeltaNet
    ("DeepSeek-V4-Flash", (21 * (512 / 4 + 128 / 4) + 20 * 512 / 128) * 2),  # 21 CSA (+ indexer keys), 20 HCA
    ("DeepSeek-V4-Pro", (30 * (512 / 4 + 128 / 4) + 31 * 512 / 128) * 2),
    ("DeepSeek-R1", 61 * (512 + 64) * 2), ("Kimi-K2-Instruct", 61 * (512 + 64) * 2),  # MLA latent + RoPE key
    ("gpt-oss-120b", 36 * 2 * 8 * 64 * 2), ("gpt-oss-20b", 24 * 2 * 8 * 64 * 2),
    ("Llama-4-Scout-17B-16E", 48 * 2 * 8 * 128 * 2),
    ("Gemma-4-31B", (50 * 2 * 16 * 256 + 10 * 4 * 512) * 2),  # global layers: K = V, one cached tensor
    ("Gemma-4-26B-A4B", (25 * 2 * 8 * 256 + 5 * 2 * 512) * 2),
])
def test_kv_bytes_per_token(name, kv_bytes):
    assert kv_bytes_per_token(_spec(name), "bf16") == kv_bytes


def test_layer_layouts():
    nxt = _spec("Qwen3-Next-80B-A3B")
    assert nxt.linear_attn_layers == 36 and nxt.state_elems > 0
    v4 = _spec("DeepSeek-V4-Flash")
    assert v4.attention == "mla" and v4.sliding_window == 128 and v4.state_elems == 43 * 128 * 512
    oss = _spec("gpt-oss-120b")
    assert oss.sliding_layers == 18 and oss.experts_per_token == 4 and oss.num_experts == 128
    scout = _spec("Llama-4-Scout-17B-16E")
    assert scout.num_experts == 16 and scout.experts_per_token == 1 and scout.sliding_layers == 36


@pytest.mark.parametrize("name, modules", [
    ("DeepSeek-V4-Flash", 1), ("DeepSeek-V4-Pro", 1), ("DeepSeek-R1", 1), ("DeepSeek-V3", 1),
    ("Kimi-K2-Instruct", 0), ("Kimi-K2.6", 0), ("gpt-oss-120b", 0), ("Qwen3-Next-80B-A3B", 0),
])
def test_mtp_modules_are_read_from_the_config(name, modules):
    entry, _ = resolve_model(name)
    text = entry.config.get("text_config") or entry.config
    assert text.get("num_nextn_predict_layers", 0) == modules  # the config's own field
    assert _spec(name).mtp_modules == modules


NEW_FAMILIES = ["DeepSeek-V4-Flash", "gpt-oss-20b", "Llama-4-Scout-17B-16E", "Gemma-4-26B-A4B", "Gemma-4-31B",
                "Qwen3-Next-80B-A3B"]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_shipped_census_of_new_families_is_a_fresh_export(name):
    """census.yaml is written by `python -m profiler.census --write-catalog`, not by hand."""
    from profiler.census import _shipped, compute_census

    spec = _spec(name)
    assert _shipped()[spec.signature()] == compute_census(spec)


def test_every_catalogue_signature_is_shipped():
    from profiler.census import _shipped

    shipped = _shipped()
    assert all(read_config(m.config, m.name).signature() in shipped for m in models())


# figures each new GPU's `source` states (the row's numbers are read from these words)
GPU_FACTS = {
    "B300": ("7.75 TB/s", "bf16 2250", "288 GB"),
    "GB200": ("8 TB/s", "bf16 2500", "186 GB", "1.8 TB/s"),
    "RTX-PRO-6000": ("1.792 TB/s", "bf16 467.8", "97887 MiB"),
    "H20": ("96 GB", "4.0 TB/s", "148 TFLOPS", "NVLink 900 GB/s"),
    "MI355X": ("288 GB", "8 TB/s", "20.1 PFLOPS", "256 CUs"),
    "MI350X": ("288 GB", "8 TB/s", "18.45 PFLOPS", "256 CUs"),
}


@pytest.mark.parametrize("name", sorted(GPU_FACTS))
def test_new_gpus_have_sourced_figures(name):
    g = {g.name: g for g in gpus()}[name]
    assert g.peak_tflops["bf16"] and g.peak_tflops["fp8"] and g.bandwidth_gbs and g.memory_gb
    for words in GPU_FACTS[name]:
        assert words in g.source, (name, words)


def test_new_gpu_rows():
    rows = {g.name: g for g in gpus()}
    assert rows["GB200"].interconnect_gbs == 1800 and rows["B300"].sm == 103 and rows["RTX-PRO-6000"].sm == 120
    assert rows["MI355X"].arch == rows["MI350X"].arch == "cdna3" and rows["H20"].arch == "hopper"
    assert rows["MI355X"].peak_tflops["fp4"] == 20100 / 2 and rows["MI350X"].peak_tflops["fp4"] == 18450 / 2
