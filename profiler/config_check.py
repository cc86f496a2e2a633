"""Bounds on the config.json fields the profiler reads, on top of the engine's (dspark_core/modeling/config_schema.py).

The profiler reads more families than the engine runs (MoE, MLA, sliding windows, a vision tower), so it checks
their fields too: expert counts 0..4096 (top-k within them), layer steps and frequencies >= 1 (they are moduli),
MLA ranks and head widths within the engine's width bounds, sliding windows within the position bound, a vision
tower's sizes bounded like a decoder's. A violation is one ProfileError line `FILE: field: what is wrong; how to fix`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dspark_core.modeling.config_schema import (
    HEAD_DIM_MAX,
    HIDDEN_MAX,
    INTERMEDIATE_MAX,
    LAYERS_MAX,
    POSITIONS_MAX,
    ConfigError,
    Count,
    DecoderConfig,
    Flag,
    validate_decoder,
)
from profiler.errors import ProfileError

EXPERTS_MAX = 4096


class TopLevel(BaseModel):
    """The fields read before the language model's own config is found (multimodal configs nest it)."""

    model_config = ConfigDict(extra="allow")

    model_type: str | None = None
    architectures: Annotated[list[str], Field(max_length=64)] | None = None
    text_config: dict[str, Any] | None = None
    vision_config: dict[str, Any] | None = None
    dtype: str | None = None
    torch_dtype: str | None = None


class VisionConfig(BaseModel):
    """A SigLIP vision tower's sizes (Gemma-3), bounded like a decoder's."""

    model_config = ConfigDict(extra="allow")

    hidden_size: Count(1, HIDDEN_MAX) = 1152
    intermediate_size: Count(1, INTERMEDIATE_MAX) = 4304
    num_hidden_layers: Count(1, LAYERS_MAX) = 27
    patch_size: Count(1, 4096) = 14
    image_size: Count(1, 65536) = 896
    num_channels: Count(1, 64) = 3
    vision_use_head: Flag = True


class ProfilerConfig(DecoderConfig):
    """DecoderConfig plus the MoE / MLA / sliding-window fields profiler/arch.py reads."""

    num_experts: Count(0, EXPERTS_MAX) | None = None
    num_local_experts: Count(0, EXPERTS_MAX) | None = None
    n_routed_experts: Count(0, EXPERTS_MAX) | None = None
    num_experts_per_tok: Count(0, EXPERTS_MAX) | None = None
    moe_intermediate_size: Count(1, INTERMEDIATE_MAX) | None = None
    shared_expert_intermediate_size: Count(0, INTERMEDIATE_MAX) | None = None
    n_shared_experts: Count(0, EXPERTS_MAX) | None = None
    decoder_sparse_step: Count(1, LAYERS_MAX) | None = None
    mlp_only_layers: Annotated[list[Count(0, LAYERS_MAX)], Field(max_length=LAYERS_MAX)] | None = None
    first_k_dense_replace: Count(0, LAYERS_MAX) | None = None
    moe_layer_freq: Count(1, LAYERS_MAX) | None = None
    q_lora_rank: Count(0, HIDDEN_MAX) | None = None
    kv_lora_rank: Count(1, HIDDEN_MAX) | None = None
    qk_nope_head_dim: Count(1, HEAD_DIM_MAX) | None = None
    qk_rope_head_dim: Count(1, HEAD_DIM_MAX) | None = None
    v_head_dim: Count(1, HEAD_DIM_MAX) | None = None
    sliding_window: Count(1, POSITIONS_MAX) | None = None
    sliding_window_pattern: Count(1, LAYERS_MAX) | None = None
    hidden_act: str | None = None
    hidden_activation: str | None = None
    mlp_bias: Flag | None = None
    dtype: str | None = None
    torch_dtype: str | None = None

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> ProfilerConfig:
        experts = self.num_experts or self.num_local_experts or self.n_routed_experts or 0
        if experts and self.num_experts_per_tok and self.num_experts_per_tok > experts:
            raise ValueError(f"num_experts_per_tok: {self.num_experts_per_tok} exceeds the {experts} experts; "
                             "fix config.json from the model's published one")
        return self


def check(model: type[BaseModel], data: Any, where: str) -> Any:
    """`data` validated against `model` (ProfilerConfig, TopLevel or VisionConfig); ProfileError one line otherwise."""
    try:
        return validate_decoder(data, where, model)
    except ConfigError as e:
        raise ProfileError(str(e)) from None
