"""Architecture description of a supported decoder (Qwen3, Qwen2, Llama, Mistral) read from config.json."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dspark_core.errors import DSparkError

SUPPORTED = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
             "mistral": "MistralForCausalLM"}  # model_type -> HF architecture class name


@dataclass
class ArchConfig:
    """The fields the lean runner needs; the rest of config.json is carried along untouched in `extra`."""

    model_type: str  # qwen3 | qwen2 | llama | mistral
    vocab_size: int  # embedding rows
    hidden_size: int  # residual width
    intermediate_size: int  # SwiGLU inner width
    num_hidden_layers: int  # decoder layers
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # KV heads (GQA when fewer than query heads)
    head_dim: int  # per-head width
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base
    rope_scaling: dict[str, Any] | None = None  # llama3-style frequency scaling, if any
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2 style)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3 style)
    max_position_embeddings: int = 4096  # longest position the checkpoint was trained for
    eos_token_id: int | list[int] | None = None  # end-of-sequence token(s)
    bos_token_id: int | None = None  # beginning-of-sequence token
    extra: dict[str, Any] = field(default_factory=dict)  # untouched config.json fields

    @property
    def eos_ids(self) -> list[int]:
        """EOS token ids as a list (empty when the checkpoint declares none)."""
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], where: str = "config.json") -> ArchConfig:
        """Parse a Hugging Face config dict; one-line DSparkError for an unsupported family."""
        mtype = cfg.get("model_type")
        if mtype not in SUPPORTED:
            raise DSparkError(f"{where}: model_type {mtype!r} is not supported; use one of {', '.join(SUPPORTED)}")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            rope = cfg.get("rope_parameters") or {}
            theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
            scaling = cfg.get("rope_scaling")
            if rope.get("rope_type", "default") != "default":
                scaling = rope
            if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
                scaling = None
            return cls(
                model_type=mtype,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_scaling=scaling,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", mtype == "qwen2")),
                qk_norm=mtype == "qwen3",
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                eos_token_id=cfg.get("eos_token_id"),
                bos_token_id=cfg.get("bos_token_id"),
                extra={k: v for k, v in cfg.items() if k not in cls.__dataclass_fields__},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DSparkError(f"{where}: missing or bad field {e}; is this a decoder config.json?") from None

    @classmethod
    def from_file(cls, path: str | Path) -> ArchConfig:
        """Read `path` (a config.json or the checkpoint folder holding it)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise DSparkError(f"no config.json at {p}; point to a Hugging Face checkpoint folder")
        try:
            return cls.from_dict(json.loads(p.read_text()), str(p))
        except json.JSONDecodeError as e:
            raise DSparkError(f"{p} is not valid JSON (line {e.lineno}); fix or re-export the checkpoint") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json dict transformers reads for this architecture."""
        d = {k: v for k, v in asdict(self).items() if k not in ("extra", "qk_norm", "rope_theta", "rope_scaling")}
        d.update(self.extra)
        d["architectures"] = [SUPPORTED[self.model_type]]
        d["hidden_act"] = "silu"
        d["rope_theta"] = self.rope_theta
        d["rope_parameters"] = dict(self.rope_scaling or {"rope_type": "default"}, rope_theta=self.rope_theta)
        if self.rope_scaling:
            d["rope_scaling"] = self.rope_scaling
        if self.model_type == "qwen2":
            d.pop("attention_bias")
        return d

    def num_params(self) -> int:
        """Parameter count (embeddings once when tied)."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * hd * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h + (2 * hd if self.qk_norm else 0)
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + emb + h
