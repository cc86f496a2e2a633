"""Fuzz target `config_json`: the validated config.json readers, fed arbitrary bytes as the file.

One input is written as `config.json` of a model folder and read by every reader of that file: the engine's
(`ArchConfig.from_file`: bounds of dspark_core/modeling/config_schema.py, then what the lean runner supports), the
profiler's (`profiler.build.read_json` + `profiler.arch.read_config`: the same bounds plus MoE / MLA / vision
fields), a drafter's (`read_drafter_config`, both layouts' schemas) and, as `model.safetensors.index.json`, the
weight index reader (`weight_files`: traversal and link checks). Each may refuse with its one-line user error
(DSparkError, ProfileError); anything else escaping is a bug.
"""

from __future__ import annotations

import json
from pathlib import Path

from scratch import write

from dspark_core.drafters.dspark_layout import read_drafter_config
from dspark_core.errors import DSparkError
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.weights import weight_files
from profiler.arch import read_config
from profiler.build import read_json
from profiler.errors import ProfileError

ROOT = Path(__file__).resolve().parents[2]
MAX_LEN = 8192


def _seeds() -> list[bytes]:
    """Real configs: the tiny target and drafter, the profiler's test configs, the catalogue's MLA and multimodal
    entries, and a weight index."""
    from profiler.catalog import models

    files = [ROOT / "dspark_core/assets/tiny/target/config.json",
             ROOT / "dspark_core/assets/tiny/drafters/rnn/config.json",
             *sorted((ROOT / "tests/profiler/configs").glob("*.json"))]
    out = [f.read_bytes() for f in files]
    picks = {e.config.get("model_type") or e.name: e.config for e in models()}
    out += [json.dumps(picks[k]).encode() for k in ("deepseek_v3", "gemma3", "qwen3_moe") if k in picks]
    out.append(json.dumps({"metadata": {"total_size": 16},
                           "weight_map": {"a.weight": "model.safetensors", "b.weight": "../x.safetensors"}}).encode())
    return out


SEEDS: list[bytes] = _seeds()
DICTIONARY: list[bytes] = [f'"{k}"'.encode() for k in (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "rope_type",
    "llama3", "linear", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
    "tie_word_embeddings", "eos_token_id", "text_config", "vision_config", "gemma3", "qwen3", "llama",
    "num_experts", "num_experts_per_tok", "decoder_sparse_step", "mlp_only_layers", "kv_lora_rank",
    "sliding_window", "sliding_window_pattern", "dflash_config", "block_size", "markov_rank", "target_layer_ids",
    "mask_token_id", "markov_head_type", "dspark_tune", "weight_map", "../", "model.safetensors")] + [
    b"NaN", b"Infinity", b"-1", b"0", b"1e309", b"4294967296", b"null", b"true", b"[]", b"{}", b"[[[[[[",
    b'"\\ud800"', b'"\\udcff"', b"9" * 40]


def fuzz_one(data: bytes) -> None:
    """Every config.json reader on `data`; only their one-line user errors are expected."""
    path = write("config.json", data, "model")
    try:
        ArchConfig.from_file(path.parent)
    except DSparkError:
        pass
    try:
        read_config(read_json(path), str(path))
    except ProfileError:
        pass
    write("model.safetensors", b"", "model")
    try:
        read_drafter_config(path.parent)
    except DSparkError:
        pass
    write("model.safetensors.index.json", data, "index")
    write("model.safetensors", b"", "index")
    try:
        weight_files(path.parent.parent / "index")
    except DSparkError:
        pass
