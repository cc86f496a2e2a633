"""Load and save Hugging Face-format checkpoints (config.json + *.safetensors + tokenizer.json).

The lean model fuses q/k/v and gate/up projections; this module maps between those and the per-projection
tensors of the Hugging Face layout, so a checkpoint written here loads in transformers and vice versa.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_core.errors import DSparkError
from dspark_core.modeling.arch import ArchConfig

if TYPE_CHECKING:
    import torch

    from dspark_core.modeling.model import LeanModel

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}  # config spellings -> torch dtype names


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when available, else 'cpu'."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DSparkError(f"device {device!r} requested but CUDA is not available; use device: cpu")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The activation dtype: 'auto' -> fp32 on CPU, bf16 on CUDA; quantised weights (fp8, int8, int4, nvfp4)
    compute in bf16 (dspark_core/modeling/quant.py)."""
    import torch

    from dspark_core.modeling.quant import FORMATS

    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype in FORMATS:
        return torch.bfloat16
    if dtype not in DTYPES:
        raise DSparkError(f"weights.dtype {dtype!r} is not known to the bundled engine; use auto, fp32, bf16, fp16, "
                          f"{', '.join(FORMATS)}")
    return getattr(torch, DTYPES[dtype])


def expected_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor (Hugging Face name) a checkpoint of `arch` must hold, with the shape its config implies."""
    h, hd, v, inter = arch.hidden_size, arch.head_dim, arch.vocab_size, arch.intermediate_size
    nq, nkv = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    for i in range(arch.num_hidden_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                a + "q_proj.weight": (nq, h), a + "k_proj.weight": (nkv, h), a + "v_proj.weight": (nkv, h),
                a + "o_proj.weight": (h, nq), p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)}
        if arch.attention_bias:
            out |= {a + "q_proj.bias": (nq,), a + "k_proj.bias": (nkv,), a + "v_proj.bias": (nkv,)}
        if arch.qk_norm:
            out |= {a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)}
    return out


def _read_tensors(folder: Path, arch: ArchConfig, dev: str, dt: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, once every file is inside the folder, every header is valid, every shape matches
    the config and the load fits in memory (dspark_core/memory.py); nothing is allocated before that."""
    from dspark_core.memory import ensure_fits
    from dspark_core.modeling.weights import check_shapes, load_tensors, read_header, weight_files

    headers = [read_header(f) for f in weight_files(folder)]
    check_shapes(headers, expected_shapes(arch), folder, f"a {arch.model_type} decoder")
    weights = arch.num_params() * dt.itemsize
    read = sum(h.data_bytes for h in headers)
    fix = "use a smaller model or weights.dtype bf16, or free memory"
    if dev == "cpu":
        ensure_fits({"weights": weights, "checkpoint tensors while loading": read}, dev, f"loading {folder}", fix)
    else:
        ensure_fits({"weights": weights}, dev, f"loading {folder}", fix)
        ensure_fits({"checkpoint tensors while loading": read}, "cpu", f"reading {folder}", fix)
    out: dict[str, torch.Tensor] = {}
    for h in headers:
        out.update(load_tensors(h))
    return out


def checkpoint_folder(path: str | Path) -> Path:
    """A checkpoint folder, a fetchable model's name (`smollm2-135m`, once `models fetch` ran), or a Hugging Face
    model id (`Qwen/Qwen3-8B`) already in the local Hugging Face cache (nothing is downloaded); one DSparkError
    line naming what to do otherwise."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    text = str(path)
    from dspark_core.modeling.models_fetch import canonical, require

    if canonical(text) is not None:  # a model fetched through the package index (`models fetch`)
        return require(text)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and "://" not in text:
        try:
            from huggingface_hub import snapshot_download
            from huggingface_hub.errors import LocalEntryNotFoundError

            try:
                return Path(snapshot_download(text, local_files_only=True))
            except (LocalEntryNotFoundError, ValueError, OSError):
                pass
        except ImportError:
            pass
        raise DSparkError(f"model {text} is not on this machine: download it (`huggingface-cli download {text}`) "
                          "or set model.path to its checkpoint folder")
    raise DSparkError(f"checkpoint folder {folder} not found; run `python cli.py build-tiny` or fix the path")


def load_model(path: str | Path, device: str = "auto", dtype: str = "auto") -> LeanModel:
    """Build a LeanModel from a Hugging Face checkpoint folder (or a cached model id), in eval mode on `device`."""
    import torch

    from dspark_core.modeling.model import LeanModel

    folder = checkpoint_folder(path)
    arch = ArchConfig.from_file(folder)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    sd = _read_tensors(folder, arch, dev, dt)
    with torch.device("meta"):
        model = LeanModel(arch)
    model = model.to_empty(device=dev)
    mine: dict[str, torch.Tensor] = {}
    try:
        mine["embed.weight"] = sd["model.embed_tokens.weight"]
        mine["norm.weight"] = sd["model.norm.weight"]
        mine["lm_head.weight"] = sd["model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"]
        for i in range(arch.num_hidden_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            mine[f"layers.{i}.input_norm.weight"] = sd[p + "input_layernorm.weight"]
            mine[f"layers.{i}.post_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
            mine[f"layers.{i}.qkv.weight"] = torch.cat([sd[a + f"{x}_proj.weight"] for x in "qkv"])
            if arch.attention_bias:
                mine[f"layers.{i}.qkv.bias"] = torch.cat([sd[a + f"{x}_proj.bias"] for x in "qkv"])
            mine[f"layers.{i}.o.weight"] = sd[a + "o_proj.weight"]
            if arch.qk_norm:
                mine[f"layers.{i}.q_norm.weight"] = sd[a + "q_norm.weight"]
                mine[f"layers.{i}.k_norm.weight"] = sd[a + "k_norm.weight"]
            gate, up = sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]
            mine[f"layers.{i}.gate_up.weight"] = torch.cat([gate, up])
            mine[f"layers.{i}.down.weight"] = sd[p + "mlp.down_proj.weight"]
    except KeyError as e:  # check_shapes names every expected tensor first; kept for a checkpoint edited meanwhile
        raise DSparkError(f"checkpoint {folder} lacks tensor {e}; is it a {arch.model_type} decoder?") from None
    missing = set(model.state_dict()) - set(mine)
    if missing:
        raise DSparkError(f"checkpoint {folder} lacks weights for {sorted(missing)[0]}; re-export it")
    model.load_state_dict({k: v.to(dt) for k, v in mine.items()}, strict=False)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    from dspark_core.modeling.model import rope_inv_freq

    model.inv_freq = rope_inv_freq(arch).to(dev)
    model = model.to(dt).eval()
    from dspark_core.modeling.quant import FORMATS

    if dtype in FORMATS:  # weight-only quantisation of the decoder's projections
        from dspark_core.modeling.quant import quantize_linears

        try:
            quantize_linears(model.layers, dtype)
        except ValueError as e:
            raise DSparkError(f"weights.dtype {dtype}: {e}; use bf16 for this checkpoint") from None
    return model


def hf_state_dict(model: LeanModel) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names (q/k/v and gate/up split again)."""
    a = model.arch
    nq, nkv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed.weight,
                                   "model.norm.weight": model.norm.weight}
    if not a.tie_word_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv.weight.split([nq, nkv, nkv])
        sd |= {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v}
        if layer.qkv.bias is not None:
            qb, kb, vb = layer.qkv.bias.split([nq, nkv, nkv])
            sd |= {p + "self_attn.q_proj.bias": qb, p + "self_attn.k_proj.bias": kb, p + "self_attn.v_proj.bias": vb}
        sd[p + "self_attn.o_proj.weight"] = layer.o.weight
        if layer.q_norm is not None and layer.k_norm is not None:
            sd[p + "self_attn.q_norm.weight"] = layer.q_norm.weight
            sd[p + "self_attn.k_norm.weight"] = layer.k_norm.weight
        sd[p + "input_layernorm.weight"] = layer.input_norm.weight
        sd[p + "post_attention_layernorm.weight"] = layer.post_norm.weight
        gate, up = layer.gate_up.weight.chunk(2)
        sd[p + "mlp.gate_proj.weight"] = gate
        sd[p + "mlp.up_proj.weight"] = up
        sd[p + "mlp.down_proj.weight"] = layer.down.weight
    return sd


SAVED_FILES = frozenset({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})


def check_replaceable(path: str | Path) -> None:
    """DSparkError unless `path` is absent, empty or a checkpoint `save_model` wrote (nothing but SAVED_FILES): a
    folder holding anything else is not ours to replace."""
    p = Path(path)
    if p.exists() and (not p.is_dir() or any(f.name not in SAVED_FILES for f in p.iterdir())):
        raise DSparkError(f"{p} holds files dspark-tune did not write; pass another output folder")


def save_model(model: LeanModel, path: str | Path, dtype: str = "bf16", tokenizer_file: Path | None = None) -> Path:
    """Write config.json + model.safetensors (+ tokenizer.json) atomically into folder `path`, replacing only a
    checkpoint this function wrote (check_replaceable)."""
    import torch
    from safetensors.torch import save_file

    from dspark_core.atomic import replace_dir

    check_replaceable(path)

    def fill(tmp: Path) -> None:
        dt = getattr(torch, DTYPES[dtype])
        tensors = {k: v.detach().to("cpu", dt).contiguous() for k, v in hf_state_dict(model).items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = model.arch.to_hf_dict() | {"dtype": DTYPES[dtype], "torch_dtype": DTYPES[dtype]}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if tokenizer_file is not None:
            shutil.copy(tokenizer_file, tmp / "tokenizer.json")
            eos = model.arch.eos_ids
            tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast",
                       "model_max_length": model.arch.max_position_embeddings}
            if eos:
                tok_cfg["eos_token"] = "<|endoftext|>"
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")

    return replace_dir(path, fill)
