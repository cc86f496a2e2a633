"""Bounds on a decoder's config.json, checked before anything is sized from it; the engine and the profiler share it.

Why: every width and count in config.json sizes an allocation (embedding rows x width, one KV cache per layer) or
divides something (head width, GQA groups), and the epsilon and RoPE fields feed every forward. A negative, zero,
absurd, NaN or mistyped value, or a JSON list where an object belongs, must stop the load with one line naming the
file and the field, before torch sees it. `profiler/config_check.py` adds the fields only the profiler reads (MoE,
MLA, sliding windows, vision tower) on top of `DecoderConfig`; the engine adds what it runs (`arch.py`).

Bounds (above every published checkpoint we know, below what would overflow or hang a load; the memory estimate in
`dspark_core/memory.py` refuses what fits the bounds but not the machine):

| field | bound | why |
|---|---|---|
| vocab_size | 1 .. 2**24 | largest published vocabularies are ~262k (Gemma 3); 2**24 still indexes in int32 |
| hidden_size | 1 .. 65536 | largest published ~16k (Llama 3.1 405B) |
| intermediate_size | 1 .. 2**20 | largest published ~53k dense |
| num_hidden_layers | 1 .. 1024 | largest published ~126 |
| num_attention_heads, num_key_value_heads | 1 .. 1024 | KV heads must divide query heads (GQA groups) |
| head_dim | 1 .. 1024, or absent | absent: hidden_size must divide evenly by num_attention_heads |
| max_position_embeddings | 1 .. 2**27 | 10M-context models exist; the KV cache is sized by the engine's max_seq_len |
| rms_norm_eps | finite, 0 < eps < 1 | 0 divides by zero on a zero row; NaN poisons every norm |
| rope_theta | finite, > 1 | theta ** (i / d) must grow with i |
| rope_scaling, rope_parameters | an object or null | factors finite > 0; llama3: all four fields, high > low |
| eos_token_id, bos_token_id | integer >= 0 (eos: or a list of up to 256) | token ids |
| tie_word_embeddings, attention_bias | true / false | not strings |
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dspark_core.errors import DSparkError

VOCAB_MAX = 2**24
HIDDEN_MAX = 65536
INTERMEDIATE_MAX = 2**20
LAYERS_MAX = 1024
HEADS_MAX = 1024
HEAD_DIM_MAX = 1024
POSITIONS_MAX = 2**27
FIX = "fix config.json from the model's published one"


class ConfigError(DSparkError):
    """A config.json field out of its bounds: one line `FILE: field: what is wrong; how to fix`."""


def Count(lo: int, hi: int) -> Any:  # noqa: N802 - a type factory, read like a type
    """A JSON integer (never a float, string or bool) in [lo, hi]."""
    return Annotated[int, Field(strict=True, ge=lo, le=hi)]


Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
TokenId = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
Flag = Annotated[bool, Field(strict=True)]


def check_rope(rope: dict[str, Any] | None, field: str) -> None:
    """RoPE settings as transformers validates them: numeric factors finite and positive; a llama3 scaling complete
    with high_freq_factor > low_freq_factor. Raises ValueError('FIELD: ...')."""
    if not rope:
        return
    kind = rope.get("rope_type", rope.get("type", "default"))
    if not isinstance(kind, str):
        raise ValueError(f"{field}.rope_type: must be a string such as 'llama3', got {short_repr(kind)}")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "rope_theta", "original_max_position_embeddings"):
        v = rope.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{field}.{key}: must be a finite number > 0, got {short_repr(v)}")
    theta = rope.get("rope_theta")
    if theta is not None and theta <= 1:
        raise ValueError(f"{field}.rope_theta: must be > 1, got {short_repr(theta)}")
    if kind == "llama3":
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
                   if rope.get(k) is None]
        if missing:
            raise ValueError(f"{field}.{missing[0]}: a llama3 scaling needs it; add it")
        if rope["high_freq_factor"] <= rope["low_freq_factor"]:
            raise ValueError(f"{field}.high_freq_factor: must exceed low_freq_factor "
                             f"({rope['high_freq_factor']} <= {rope['low_freq_factor']})")


class DecoderConfig(BaseModel):
    """The fields of a decoder config.json that size or parameterise the model; other fields pass through."""

    model_config = ConfigDict(extra="allow")

    model_type: str | None = None
    hidden_size: Count(1, HIDDEN_MAX)
    num_hidden_layers: Count(1, LAYERS_MAX)
    num_attention_heads: Count(1, HEADS_MAX)
    vocab_size: Count(1, VOCAB_MAX)
    intermediate_size: Count(1, INTERMEDIATE_MAX)
    num_key_value_heads: Count(1, HEADS_MAX) | None = None
    head_dim: Count(1, HEAD_DIM_MAX) | None = None
    max_position_embeddings: Count(1, POSITIONS_MAX) | None = None
    rms_norm_eps: Annotated[float, Field(strict=True, gt=0, lt=1, allow_inf_nan=False)] | None = None
    rope_theta: Annotated[float, Field(strict=True, gt=1, allow_inf_nan=False)] | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None
    tie_word_embeddings: Flag | None = None
    attention_bias: Flag | None = None
    eos_token_id: TokenId | Annotated[list[TokenId], Field(max_length=256)] | None = None
    bos_token_id: TokenId | None = None

    @model_validator(mode="after")
    def _shapes_agree(self) -> DecoderConfig:
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if kv is not None and heads % kv:
            raise ValueError(f"num_key_value_heads: {kv} does not divide num_attention_heads {heads} (each KV head "
                             "serves a whole group of query heads); set a divisor")
        if self.head_dim is None and self.hidden_size % heads:
            raise ValueError(f"num_attention_heads: {heads} does not divide hidden_size {self.hidden_size} and "
                             "there is no head_dim; add head_dim or fix the head count")
        check_rope(self.rope_scaling, "rope_scaling")
        check_rope(self.rope_parameters, "rope_parameters")
        return self


def short_repr(v: Any) -> str:
    """A value as a short one-line repr (JSON where possible)."""
    try:
        text = json.dumps(v)  # ASCII: a lone surrogate escape is written out, so the line can always be printed
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(v).__name__} of {len(v)}>" if isinstance(v, dict | list) else ascii(v)
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`Section | None` -> Section), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _bounds(model: type[BaseModel], name: str) -> tuple[float | None, float | None]:
    """The ge / le bounds pydantic holds for field `name` (through an Optional)."""
    field = model.model_fields[name]
    lo = hi = None
    metas = list(field.metadata)
    for arg in getattr(field.annotation, "__args__", ()):  # X | None: the bounds sit on X's metadata
        metas += list(getattr(arg, "__metadata__", ()))
    for m in metas:
        for item in getattr(m, "metadata", [m]):
            lo = item.ge if getattr(item, "ge", None) is not None else lo
            hi = item.le if getattr(item, "le", None) is not None else hi
    return lo, hi


def error_line(where: str, e: ValidationError, model: type[BaseModel], data: Any, fix: str = FIX) -> str:
    """One line for the first problem pydantic found: `FILE: field: what is wrong, got X; how to fix`."""
    err = e.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")
    path: list[str] = []
    owner: type[BaseModel] | None = model
    value = data
    for x in err["loc"]:  # walk the fields (and list indices) pydantic names, stopping at union member tags
        if isinstance(x, int) and isinstance(value, list) and x < len(value):
            path[-1] += f"[{x}]"
            value = value[x]
        elif owner is not None and isinstance(x, str) and x in owner.model_fields and isinstance(value, dict):
            path.append(x)
            value = value.get(x)
            lo, hi = _bounds(owner, x)
            owner = _model_of(owner.model_fields[x].annotation)
        else:
            break
    if not path:  # a model validator's message already names its field and the fix
        return f"{where}: {msg}"
    name = ".".join(path)
    if err["type"] == "missing":
        return f"{where}: {name}: missing; {fix}"
    if err["type"] in ("int_type", "int_from_float", "greater_than_equal", "less_than_equal") and lo is not None:
        what = "a positive integer" if lo == 1 else "a non-negative integer" if lo == 0 else f"an integer >= {lo}"
        msg = f"must be {what}" + (f" <= {hi}" if hi is not None else "")
    elif err["type"] in ("dict_type", "model_type", "model_attributes_type"):
        msg = "must be an object or null"
    return f"{where}: {name}: {msg}, got {short_repr(value)}; {fix}"


def validate_decoder(data: Any, where: str, model: type[BaseModel] = DecoderConfig, fix: str = FIX) -> Any:
    """`data` (a parsed config.json) checked against `model` (DecoderConfig or an extension of it); returns the
    model instance, or raises ConfigError with one line naming `where`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level is a JSON {_json_kind(data)}, not an object; a config.json is one "
                          "object of fields ({\"model_type\": ..., \"hidden_size\": ...})")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(error_line(where, e, model, data, fix)) from None


def _json_kind(v: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(v), type(v).__name__)
