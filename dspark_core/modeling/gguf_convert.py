"""A Llama-architecture GGUF file -> a Hugging Face checkpoint folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json), read with the `gguf` package (gguf-py).

* Tensors are dequantised to float32 (`gguf.quants.dequantize`; any type gguf-py knows, e.g. Q4_1 / Q8_0 / F16)
  and renamed to the Hugging Face layout. llama.cpp's converter permutes the rows of the query and key projections
  of Llama models (rotary pairs (i, i + d/2) become adjacent rows); that is undone here, so the checkpoint rotates
  as the rotate-half convention of transformers and of the bundled engine expects.
* The tokenizer is rebuilt from the file's vocabulary: byte-level BPE (`tokenizer.ggml.model: gpt2`) with its merges,
  the control tokens as special tokens, and the pre-tokenizer the file names (`tokenizer.ggml.pre`).
* The folder is written beside its final path and renamed into place; `conversion.json` records the source file's
  sha256, so converting the same file again is a no-op.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dspark_core.atomic import replace_dir
from dspark_core.errors import DSparkError

STAMP = "conversion.json"
CONVERTER_VERSION = 1  # bump when the output of a conversion changes
CONTROL = 3  # gguf token type of a control (special) token
LAYER_NAMES = {  # gguf block tensor -> Hugging Face name under model.layers.{i}.
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    if len(f.data) == 1 and f.types and f.types[0].name != "ARRAY":
        part = f.parts[f.data[0]]
        return bytes(part).decode("utf-8") if f.types[0].name == "STRING" else part.tolist()[0]
    return f


def _strings(field: Any) -> list[str]:
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def unpermute_rows(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation: [n_head * d, in] with rotary pairs interleaved -> rotate-half order."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(r: Any) -> dict[str, Any]:
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise DSparkError(f"GGUF architecture {arch!r} is not supported; the converter reads llama-architecture files")
    hidden = int(_field(r, "llama.embedding_length"))
    heads = int(_field(r, "llama.attention.head_count"))
    tok = _field(r, "tokenizer.ggml.tokens")
    vocab = int(_field(r, "llama.vocab_size", len(tok.data) if tok is not None else 0))
    tied = not any(t.name == "output.weight" for t in r.tensors)
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": int(_field(r, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(r, "llama.block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(_field(r, "llama.attention.head_count_kv", heads)),
        "head_dim": int(_field(r, "llama.rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(_field(r, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(r, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(r, "llama.context_length", 2048)), "vocab_size": vocab,
        "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "float32",
    }
    for key, name in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                      ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        v = _field(r, key)
        if v is not None:
            cfg[name] = int(v)
    return cfg


def _tensors(r: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch
    from gguf import quants

    out: dict[str, Any] = {}
    for t in r.tensors:
        w = np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        name = t.name.removesuffix(".weight")
        if name == "token_embd":
            key = "model.embed_tokens.weight"
        elif name == "output_norm":
            key = "model.norm.weight"
        elif name == "output":
            key = "lm_head.weight"
        elif name.startswith("blk."):
            _, i, part = name.split(".", 2)
            if part not in LAYER_NAMES:
                raise DSparkError(f"GGUF tensor {t.name} has no Hugging Face counterpart in a llama model")
            key = f"model.layers.{i}.{LAYER_NAMES[part]}.weight"
            if part == "attn_q":
                w = unpermute_rows(w, cfg["num_attention_heads"])
            elif part == "attn_k":
                w = unpermute_rows(w, cfg["num_key_value_heads"])
        elif name == "rope_freqs":
            continue  # recomputed from the config's rope settings
        else:
            raise DSparkError(f"GGUF tensor {t.name} has no Hugging Face counterpart in a llama model")
        out[key] = torch.from_numpy(w.copy())
    return out


def _tokenizer(r: Any) -> tuple[str, dict[str, Any]]:
    """tokenizer.json text and tokenizer_config.json of the file's vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = _field(r, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise DSparkError(f"GGUF tokenizer {kind!r} is not supported; the converter rebuilds byte-level BPE (gpt2)")
    tokens = _strings(_field(r, "tokenizer.ggml.tokens"))
    merges_f = _field(r, "tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in _strings(merges_f)] if merges_f is not None else []
    types_f = _field(r, "tokenizer.ggml.token_type")
    types = [int(types_f.parts[i][0]) for i in types_f.data] if types_f is not None else [1] * len(tokens)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                               byte_fallback=False))
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if _field(r, "tokenizer.ggml.pre") in ("smollm", "llama3"):
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))  # these pre-tokenizers split every digit
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    special = [t for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                           "model_max_length": int(_field(r, "llama.context_length", 2048)),
                           "add_bos_token": bool(_field(r, "tokenizer.ggml.add_bos_token", False))}
    names = (("tokenizer.ggml.bos_token_id", "bos_token"), ("tokenizer.ggml.eos_token_id", "eos_token"),
             ("tokenizer.ggml.padding_token_id", "pad_token"), ("tokenizer.ggml.unknown_token_id", "unk_token"))
    for key, name in names:
        v = _field(r, key)
        if v is not None and 0 <= int(v) < len(tokens):
            cfg[name] = tokens[int(v)]
    template = _field(r, "tokenizer.chat_template")
    if isinstance(template, str):
        cfg["chat_template"] = template
    return tok.to_str(), cfg


def convert_gguf(gguf_path: str | Path, out: str | Path, force: bool = False) -> Path:
    """Convert `gguf_path` into the checkpoint folder `out` (atomically; a no-op when `out` already holds this
    file's conversion, unless `force`). Returns `out`."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    src, dst = Path(gguf_path), Path(out)
    if not src.is_file():
        raise DSparkError(f"GGUF file {src} not found")
    digest = sha256_of(src)
    stamp = dst / STAMP
    if dst.exists() and (not dst.is_dir() or (any(dst.iterdir()) and not stamp.is_file())):
        raise DSparkError(f"{dst} exists and is not a conversion of ours; pass another output folder")
    if stamp.is_file() and not force:
        try:
            prev = json.loads(stamp.read_text())
            if prev.get("sha256") == digest and prev.get("converter") == CONVERTER_VERSION:
                return dst
        except ValueError:
            pass
    try:
        reader = GGUFReader(str(src))
    except (ValueError, OSError) as e:
        raise DSparkError(f"{src} is not a readable GGUF file ({e})") from None
    cfg = _config(reader)

    def fill(tmp: Path) -> None:
        save_file(_tensors(reader, cfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        tok_json, tok_cfg = _tokenizer(reader)
        (tmp / "tokenizer.json").write_text(tok_json)
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
        (tmp / STAMP).write_text(json.dumps({"source": src.name, "sha256": digest, "converter": CONVERTER_VERSION},
                                            indent=2) + "\n")

    return replace_dir(dst, fill)
