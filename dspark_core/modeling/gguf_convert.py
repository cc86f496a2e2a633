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
* The header is read by gguf_header.py (every count and length bounded by the file), the metadata typed, the config
  it implies bounded like any config.json (config_schema.py), every tensor's shape checked against it, the vocabulary
  against itself and the memory of the dequantised tensors against what is free, all before a tensor is read:
  `read_gguf_model` is what the `gguf` fuzz target (benchmarks/fuzz/) drives.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_core.atomic import replace_dir
from dspark_core.errors import DSparkError
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.config_schema import validate_decoder
from dspark_core.modeling.gguf_header import (
    ARRAY,
    BOOL,
    FLOAT_TYPES,
    INT_TYPES,
    STRING,
    TYPE_NAMES,
    GGUFHeader,
    ggml_sizes,
    read_gguf_header,
)

FIX = "the file's metadata is wrong: download it again or convert another GGUF"
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


@dataclass(frozen=True)
class GGUFModel:
    """A llama GGUF whose header, metadata, tensor shapes and vocabulary were checked (`read_gguf_model`)."""

    header: GGUFHeader
    config: dict[str, Any]  # the config.json it converts to
    arch: ArchConfig


_MISSING = object()
_KINDS = {"str": ({STRING}, None), "int": (INT_TYPES, None), "float": (INT_TYPES | FLOAT_TYPES, None),
          "bool": ({BOOL}, None), "strs": ({ARRAY}, {STRING}), "ints": ({ARRAY}, INT_TYPES)}


def _get(h: GGUFHeader, key: str, kind: str, default: Any = _MISSING) -> Any:
    """Metadata `key` of GGUF type `kind` (str, int, float, bool, strs, ints); `default` when absent; one
    DSparkError line naming the key when it is missing without a default or has another type."""
    if key not in h.metadata:
        if default is _MISSING:
            raise DSparkError(f"{h.path}: GGUF metadata {key} is missing; {FIX}")
        return default
    types, elems = _KINDS[kind]
    vtype = h.types[key]
    if vtype not in types or (elems is not None and h.elem_types.get(key) not in elems):
        got = TYPE_NAMES.get(vtype, str(vtype)) + (f" of {TYPE_NAMES.get(h.elem_types.get(key, -1), '?')}"
                                                   if vtype == ARRAY else "")
        raise DSparkError(f"{h.path}: GGUF metadata {key} is {got}, not {kind}; {FIX}")
    return h.metadata[key]


def unpermute_rows(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation: [n_head * d, in] with rotary pairs interleaved -> rotate-half order."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(h: GGUFHeader) -> dict[str, Any]:
    """config.json of the file's llama metadata, bounded like any config.json (config_schema.py)."""
    arch = _get(h, "general.architecture", "str", None)
    if arch != "llama":
        raise DSparkError(f"GGUF architecture {arch!r} is not supported; the converter reads llama-architecture files")
    hidden = _get(h, "llama.embedding_length", "int")
    heads = _get(h, "llama.attention.head_count", "int")
    tokens = _get(h, "tokenizer.ggml.tokens", "strs", None)
    vocab = _get(h, "llama.vocab_size", "int", len(tokens) if tokens is not None else 0)
    tied = not any(t.name == "output.weight" for t in h.tensors)
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": _get(h, "llama.feed_forward_length", "int"),
        "num_hidden_layers": _get(h, "llama.block_count", "int"), "num_attention_heads": heads,
        "num_key_value_heads": _get(h, "llama.attention.head_count_kv", "int", heads),
        "head_dim": _get(h, "llama.rope.dimension_count", "int", hidden // heads if heads else 0),
        "rms_norm_eps": float(_get(h, "llama.attention.layer_norm_rms_epsilon", "float", 1e-5)),
        "rope_theta": float(_get(h, "llama.rope.freq_base", "float", 10000.0)),
        "max_position_embeddings": _get(h, "llama.context_length", "int", 2048), "vocab_size": vocab,
        "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "float32",
    }
    for key, name in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                      ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        v = _get(h, key, "int", None)
        if v is not None:
            cfg[name] = v
    where = f"{h.path} (its llama metadata as config.json)"
    validate_decoder(cfg, where, fix=FIX)
    return cfg


def _expected(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> numpy shape the metadata implies (llama.cpp's names)."""
    h, v, inter = arch.hidden_size, arch.vocab_size, arch.intermediate_size
    nq, nkv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
    if not arch.tie_word_embeddings:
        out["output.weight"] = (v, h)
    shapes = {"attn_norm": (h,), "ffn_norm": (h,), "attn_q": (nq, h), "attn_k": (nkv, h), "attn_v": (nkv, h),
              "attn_output": (h, nq), "ffn_gate": (inter, h), "ffn_up": (inter, h), "ffn_down": (h, inter)}
    for i in range(arch.num_hidden_layers):
        out |= {f"blk.{i}.{part}.weight": shape for part, shape in shapes.items()}
    return out


def _check_tensors(h: GGUFHeader, arch: ArchConfig) -> None:
    """Every tensor a llama tensor of the shape the metadata implies, and none missing."""
    expected = _expected(arch)
    seen = set()
    for t in h.tensors:
        if t.name == "rope_freqs.weight":
            continue  # recomputed from the config's rope settings
        if t.name not in expected:
            raise DSparkError(f"{h.path}: GGUF tensor {t.name} has no Hugging Face counterpart in a llama model")
        if t.shape != expected[t.name]:
            raise DSparkError(f"{h.path}: tensor {t.name} has shape {list(t.shape)} but the metadata implies "
                              f"{list(expected[t.name])}; {FIX}")
        seen.add(t.name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise DSparkError(f"{h.path}: GGUF lacks tensor {missing[0]} ({len(missing)} missing); {FIX}")


def _check_vocab(h: GGUFHeader, vocab_size: int) -> None:
    """A byte-level BPE vocabulary the tokenizer can be rebuilt from: gpt2 model, tokens within the embedding,
    one type per token, merges of two known tokens into a known token."""
    kind = _get(h, "tokenizer.ggml.model", "str", None)
    if kind != "gpt2":
        raise DSparkError(f"GGUF tokenizer {kind!r} is not supported; the converter rebuilds byte-level BPE (gpt2)")
    tokens = _get(h, "tokenizer.ggml.tokens", "strs")
    if not 1 <= len(tokens) <= vocab_size:
        raise DSparkError(f"{h.path}: {len(tokens)} tokens for an embedding of {vocab_size} rows; {FIX}")
    types = _get(h, "tokenizer.ggml.token_type", "ints", None)
    if types is not None and len(types) != len(tokens):
        raise DSparkError(f"{h.path}: {len(types)} token types for {len(tokens)} tokens; {FIX}")
    known = set(tokens)
    for m in _get(h, "tokenizer.ggml.merges", "strs", []):
        left, sep, right = m.partition(" ")
        if not sep or not left or not right or left not in known or right not in known:
            raise DSparkError(f"{h.path}: merge {m[:40]!r} is not two tokens of the vocabulary; {FIX}")
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.unknown_token_id"):
        _get(h, key, "int", None)
    _get(h, "tokenizer.ggml.add_bos_token", "bool", None)
    _get(h, "tokenizer.ggml.pre", "str", None)
    _get(h, "tokenizer.chat_template", "str", None)


def read_gguf_model(path: str | Path) -> GGUFModel:
    """A llama GGUF's header, config, tensor shapes and vocabulary, checked; one DSparkError line otherwise. Reads
    the header only."""
    h = read_gguf_header(path)
    cfg = _config(h)
    arch = ArchConfig.from_dict(cfg, f"{h.path} (its llama metadata as config.json)")
    _check_tensors(h, arch)
    _check_vocab(h, arch.vocab_size)
    return GGUFModel(h, cfg, arch)


def dequantized(m: GGUFModel) -> dict[str, Any]:
    """The tensors as float32 torch tensors under Hugging Face names (q / k rows unpermuted), once they fit in
    memory; a non-finite value is one line naming the tensor."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, quants

    from dspark_core.memory import ensure_fits

    h, sizes = m.header, ggml_sizes()
    elements = sum(int(np.prod(t.dims)) for t in h.tensors)
    ensure_fits({"dequantised tensors (numpy + torch)": 8 * elements}, "cpu", f"converting {h.path}",
                "convert on a machine with more memory")
    data = np.memmap(h.path, mode="r", dtype=np.uint8)
    out: dict[str, Any] = {}
    for t in h.tensors:
        if t.name == "rope_freqs.weight":
            continue
        block, type_size = sizes[t.ggml_type]
        start = h.data_offset + t.offset
        raw = data[start : start + t.n_bytes].reshape(*t.shape[:-1], t.shape[-1] // block * type_size)
        w = np.ascontiguousarray(quants.dequantize(raw, GGMLQuantizationType(t.ggml_type)), dtype=np.float32)
        if not np.isfinite(w).all():
            raise DSparkError(f"{h.path}: tensor {t.name} holds NaN or infinite values; {FIX}")
        name = t.name.removesuffix(".weight")
        if name == "token_embd":
            key = "model.embed_tokens.weight"
        elif name == "output_norm":
            key = "model.norm.weight"
        elif name == "output":
            key = "lm_head.weight"
        else:
            _, i, part = name.split(".", 2)
            key = f"model.layers.{i}.{LAYER_NAMES[part]}.weight"
            if part == "attn_q":
                w = unpermute_rows(w, m.arch.num_attention_heads)
            elif part == "attn_k":
                w = unpermute_rows(w, m.arch.num_key_value_heads)
        out[key] = torch.from_numpy(w.copy())
    return out


def tokenizer_files(m: GGUFModel) -> tuple[str, dict[str, Any]]:
    """tokenizer.json text and tokenizer_config.json of the file's (checked) vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    h = m.header
    tokens = _get(h, "tokenizer.ggml.tokens", "strs")
    merges = [tuple(x.split(" ", 1)) for x in _get(h, "tokenizer.ggml.merges", "strs", [])]
    types = _get(h, "tokenizer.ggml.token_type", "ints", None) or [1] * len(tokens)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                               byte_fallback=False))
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if _get(h, "tokenizer.ggml.pre", "str", None) in ("smollm", "llama3"):
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))  # these pre-tokenizers split every digit
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    special = [t for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                           "model_max_length": m.config["max_position_embeddings"],
                           "add_bos_token": bool(_get(h, "tokenizer.ggml.add_bos_token", "bool", False))}
    names = (("tokenizer.ggml.bos_token_id", "bos_token"), ("tokenizer.ggml.eos_token_id", "eos_token"),
             ("tokenizer.ggml.padding_token_id", "pad_token"), ("tokenizer.ggml.unknown_token_id", "unk_token"))
    for key, name in names:
        v = _get(h, key, "int", None)
        if v is not None and 0 <= v < len(tokens):
            cfg[name] = tokens[v]
    template = _get(h, "tokenizer.chat_template", "str", None)
    if template is not None:
        cfg["chat_template"] = template
    return tok.to_str(), cfg


def convert_gguf(gguf_path: str | Path, out: str | Path, force: bool = False) -> Path:
    """Convert `gguf_path` into the checkpoint folder `out` (atomically; a no-op when `out` already holds this
    file's conversion, unless `force`). Returns `out`."""
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
            if isinstance(prev, dict) and prev.get("sha256") == digest and prev.get("converter") == CONVERTER_VERSION:
                return dst
        except ValueError:
            pass
    model = read_gguf_model(src)

    def fill(tmp: Path) -> None:
        save_file(dequantized(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(model.config, indent=2) + "\n")
        tok_json, tok_cfg = tokenizer_files(model)
        (tmp / "tokenizer.json").write_text(tok_json)
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
        (tmp / STAMP).write_text(json.dumps({"source": src.name, "sha256": digest, "converter": CONVERTER_VERSION},
                                            indent=2) + "\n")

    return replace_dir(dst, fill)
