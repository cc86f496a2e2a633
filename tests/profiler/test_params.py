"""Parameter counts: the catalogue against published figures, real config.json files against transformers."""

from __future__ import annotations

import json
import math

import pytest

from profiler.arch import read_config
from profiler.catalog import models, resolve_model
from profiler.model import count_params

from .conftest import CONFIGS


def _sig_digits(x: float) -> int:
    """Significant digits a published figure is given to (8.2e9 -> 2, 7.61e9 -> 3)."""
    mant = f"{x:.6e}".split("e")[0].replace(".", "").rstrip("0")
    return max(1, len(mant))


def _tolerance(x: float) -> float:
    """1 %, or one unit of the last published digit when the figure is coarser than that (3.3B, 0.6B)."""
    unit = 10 ** (math.floor(math.log10(x)) - _sig_digits(x) + 1)
    return max(0.01, unit / x)


def _active(entry, counts) -> float:
    return counts.active - (counts.embedding if entry.published.active_excludes_input_embedding else 0)


def _total(entry, counts) -> float:
    return counts.total - (counts.vision if entry.published.total_excludes_vision else 0)


def test_at_least_eight_models_within_one_percent_of_published():
    precise = [m for m in models() if _sig_digits(m.published.params_total) >= 3]
    assert len(precise) >= 8
    for m in precise:
        total = _total(m, count_params(read_config(m.config, m.name)))
        assert abs(total / m.published.params_total - 1) <= max(0.01, m.published.tolerance or 0), (m.name, total)


def test_an_approximate_published_figure_says_why():
    for m in models():
        assert (m.published.tolerance is None) == (m.published.tolerance_why is None), m.name


@pytest.mark.parametrize("entry", models(), ids=lambda m: m.name)
def test_every_catalogue_model_matches_its_published_counts(entry):
    c = count_params(read_config(entry.config, entry.name))
    pub = entry.published
    tol = max(_tolerance(pub.params_total), pub.tolerance or 0)
    assert abs(_total(entry, c) / pub.params_total - 1) <= tol, c.total
    if pub.params_active is not None:
        assert abs(_active(entry, c) / pub.params_active - 1) <= _tolerance(pub.params_active), c.active
    else:
        assert c.active == c.total - c.vision  # dense: every text parameter is active


# real-format config.json files -> the catalogue row they are the config of
CONFIG_FILES = {
    "llama-3.1-8b.json": "Llama-3.1-8B", "llama-3.1-8b-transformers5.json": "Llama-3.1-8B",
    "qwen2.5-7b.json": "Qwen2.5-7B", "qwen2.5-0.5b.json": "Qwen2.5-0.5B", "qwen3-8b.json": "Qwen3-8B",
    "qwen3-30b-a3b.json": "Qwen3-30B-A3B", "mistral-7b-v0.3.json": "Mistral-7B-v0.3",
    "mixtral-8x7b-v0.1.json": "Mixtral-8x7B-v0.1", "gemma-2-9b.json": "Gemma-2-9B",
}


@pytest.mark.parametrize("fname", sorted(CONFIG_FILES))
def test_real_config_files_give_published_totals_and_active(fname):
    raw = json.loads((CONFIGS / fname).read_text())
    c = count_params(read_config(raw, fname))
    entry, _ = resolve_model(CONFIG_FILES[fname])
    pub = entry.published
    assert abs(c.total / pub.params_total - 1) <= _tolerance(pub.params_total)
    if pub.params_active is not None:
        assert c.active < c.total
        assert abs(_active(entry, c) / pub.params_active - 1) <= _tolerance(pub.params_active)


def _meta_model(raw: dict):
    """The model transformers builds from ``raw``, on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = AutoConfig.for_model(**raw)
    auto = AutoModelForImageTextToText if "vision_config" in raw else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(cfg)


@pytest.mark.parametrize("fname", sorted(CONFIG_FILES))
def test_counts_equal_transformers_for_real_config_files(fname):
    raw = json.loads((CONFIGS / fname).read_text())
    model = _meta_model(raw)
    c = count_params(read_config(raw, fname))
    assert c.total == sum(p.numel() for p in model.parameters())
    spec = read_config(raw, fname)
    if spec.is_moe:  # active = total minus the unrouted experts, read off transformers' expert modules
        experts = [m for name, m in model.named_modules() if name.endswith("mlp.experts")]
        per_expert = sum(p.numel() for p in experts[0].parameters()) // spec.num_experts
        unrouted = len(experts) * (spec.num_experts - spec.experts_per_token) * per_expert
        assert c.active == c.total - unrouted


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Gemma-3-1B", "Gemma-3-4B", "Qwen3-235B-A22B"])
def test_counts_equal_transformers_for_mla_and_multimodal_catalogue_rows(name):
    entry, _ = resolve_model(name)
    model = _meta_model(entry.config)
    c = count_params(read_config(entry.config, name))
    n = sum(p.numel() for p in model.parameters())
    # DeepSeek's router correction bias ships in the checkpoint but transformers keeps it as a buffer;
    # neither side builds the MTP layer (num_nextn_predict_layers)
    n += sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    assert c.total == n
