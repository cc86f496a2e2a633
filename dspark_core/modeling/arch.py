"""Architecture description of a supported decoder (Qwen3, Qwen2, Llama, Mistral) read from config.json."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dspark_core.errors import DSparkError
from dspark_core.modeling.config_schema import ConfigError, short_repr, validate_decoder

SUPPORTED = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
             "mistral": "MistralForCausalLM"}  # model_type -> HF architecture class name
RUNS_ROPE = ("llama3", "linear")  # RoPE scalings rope_inv_freq implements (model.py); others are refused
CONFIG_MAX_BYTES = 16 * 2**20  # a config.json is a few kB; a larger file is not one


def read_json_file(p: Path) -> Any:
    """A small JSON file parsed (NaN / Infinity literals kept for the bounds to name); one DSparkError line when it
    is too large, not UTF-8 or not JSON."""
    try:
        size = p.stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise DSparkError(f"{p}: {size} bytes is not a config.json (limit {CONFIG_MAX_BYTES}); point to the "
                              "checkpoint's config.json")
        return json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise DSparkError(f"{p} is not UTF-8 text; fix or re-export the checkpoint's config.json") from None
    except json.JSONDecodeError as e:
        raise DSparkError(f"{p} is not valid JSON (line {e.lineno}); fix or re-export the checkpoint") from None
    except ValueError as e:  # a number past Python's 4300-digit limit for int parsing
        raise DSparkError(f"{p} is not a config.json ({' '.join(str(e).split())[:80]}); fix or re-export the "
                          "checkpoint") from None
    except RecursionError:
        raise DSparkError(f"{p} nests too deeply to be a config.json; fix or re-export the checkpoint") from None
    except OSError as e:
        raise DSparkError(f"{p}: cannot read it ({e.strerror}); check the path and its permissions") from None


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
    def from_dict(cls, cfg: Any, where: str = "config.json") -> ArchConfig:
        """Parse a Hugging Face config dict, bounded (config_schema.py) before anything is sized from it; one-line
        DSparkError for a bad field or an unsupported family."""
        if isinstance(cfg, dict) and cfg.get("model_type") not in SUPPORTED:
            raise DSparkError(f"{where}: model_type {short_repr(cfg.get('model_type'))} is not supported; use one of "
                              f"{', '.join(SUPPORTED)}")
        v = validate_decoder(cfg, where)
        mtype = str(v.model_type)
        heads, hidden = v.num_attention_heads, v.hidden_size
        rope = v.rope_parameters or {}
        theta = rope.get("rope_theta", v.rope_theta if v.rope_theta is not None else 10000.0)
        scaling = v.rope_scaling
        if rope.get("rope_type", "default") != "default":
            scaling = rope
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        head_dim = v.head_dim or hidden // heads
        if head_dim % 2:
            raise ConfigError(f"{where}: head_dim: {head_dim} is odd; RoPE rotates pairs of channels, so the engine "
                              "runs even head widths only: fix config.json from the model's published one")
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in RUNS_ROPE:
                raise ConfigError(f"{where}: rope_scaling: type {short_repr(kind)} is not run by the bundled engine "
                                  f"(it runs {', '.join(RUNS_ROPE)}); serve this model with SGLang or vLLM")
            if scaling.get("factor") is None:
                raise ConfigError(f"{where}: rope_scaling.factor: a {kind} scaling needs it; add it")
        return cls(
            model_type=mtype,
            vocab_size=v.vocab_size,
            hidden_size=hidden,
            intermediate_size=v.intermediate_size,
            num_hidden_layers=v.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=v.num_key_value_heads or heads,
            head_dim=head_dim,
            rms_norm_eps=v.rms_norm_eps if v.rms_norm_eps is not None else 1e-6,
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(v.tie_word_embeddings),
            attention_bias=v.attention_bias if v.attention_bias is not None else mtype == "qwen2",
            qk_norm=mtype == "qwen3",
            max_position_embeddings=v.max_position_embeddings or 4096,
            eos_token_id=v.eos_token_id,
            bos_token_id=v.bos_token_id,
            extra={k: x for k, x in cfg.items() if k not in cls.__dataclass_fields__},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ArchConfig:
        """Read `path` (a config.json or the checkpoint folder holding it; inside that folder, not a link out)."""
        p = Path(path)
        if p.is_dir():
            from dspark_core.modeling.weights import inside

            p = inside(p, p / "config.json")
        if not p.is_file():
            raise DSparkError(f"no config.json at {p}; point to a Hugging Face checkpoint folder")
        return cls.from_dict(read_json_file(p), str(p))

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
