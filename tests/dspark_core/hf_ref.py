"""Helpers for tests: random-weight Hugging Face checkpoints of each supported family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {"model_type": "qwen3", "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": False},
    "llama": {
        "model_type": "llama",
        "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
    },
    "mistral": {"model_type": "mistral", "tie_word_embeddings": False, "sliding_window": None},
}


def make_random_checkpoint(family: str, folder: Path, seed: int = 0) -> Path:
    """Write a tiny random-weight HF checkpoint of `family` (saved by transformers itself) into `folder`."""
    import torch
    import transformers

    spec = dict(FAMILIES[family])
    mtype = spec.pop("model_type")
    cfg_cls = transformers.AutoConfig.for_model(mtype).__class__
    rope_scaling = spec.pop("rope_scaling", None)
    cfg = cfg_cls(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rope_theta=500.0, **spec)
    if rope_scaling is not None:
        cfg.rope_parameters = dict(rope_scaling, rope_theta=500.0)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # make norms and biases non-trivial so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return folder
