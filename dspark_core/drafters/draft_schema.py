"""Bounds on a DSpark drafter's config file (either layout), checked before the drafter is sized from it.

Why: a drafter's Markov head is two vocab x rank matrices and its block sizes the per-round buffers, so a hostile
`markov_rank` or `block_size` once asked torch for 16 TB. The decoder fields (widths, heads, epsilon, RoPE) carry
the target's bounds (dspark_core/modeling/config_schema.py); the drafter's own:

| field | bound | why |
|---|---|---|
| block_size (top level or dflash_config) | 1 .. 64 | released drafters are trained at 7-16; the engine drafts <= 16 |
| markov_rank | 1 .. 4096 | the paper's drafters use 256; both engines need > 0 |
| num_hidden_layers | 1 .. 64 | published drafters have 1-8 layers |
| target_layer_ids | 1 .. 64 ids, each 0 .. 1023 | one context feature per chosen target layer |
| mask_token_id | 0 .. vocab_size - 1 | a row of the target's embedding |
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from dspark_core.modeling.config_schema import (
    HEAD_DIM_MAX,
    HEADS_MAX,
    HIDDEN_MAX,
    INTERMEDIATE_MAX,
    LAYERS_MAX,
    VOCAB_MAX,
    Count,
    DecoderConfig,
    Flag,
    validate_decoder,
)

BLOCK_MAX = 64
RANK_MAX = 4096
DRAFT_LAYERS_MAX = 64
CONTEXT_LAYERS_MAX = 64
FIX = "retrain the drafter (`python cli.py train-drafter`) or fix its config file"

LayerIds = Annotated[list[Count(0, LAYERS_MAX - 1)], Field(min_length=1, max_length=CONTEXT_LAYERS_MAX)]


class DflashSection(BaseModel):
    """`dflash_config` of the engines' layout."""

    model_config = ConfigDict(extra="allow")

    block_size: Count(1, BLOCK_MAX) | None = None
    target_layer_ids: LayerIds | None = None
    num_target_layers: Count(1, LAYERS_MAX) | None = None
    mask_token_id: Count(0, VOCAB_MAX - 1) | None = None


class EngineDrafterFile(DecoderConfig):
    """config.json of a drafter in the layout SGLang and vLLM load (dspark_layout.py)."""

    num_hidden_layers: Count(1, DRAFT_LAYERS_MAX)
    block_size: Count(1, BLOCK_MAX) | None = None
    markov_rank: Count(1, RANK_MAX)
    markov_head_type: str | None = None
    target_layer_ids: LayerIds | None = None
    mask_token_id: Count(0, VOCAB_MAX - 1) | None = None
    dflash_config: DflashSection | None = None
    dspark_tune: dict[str, Any] | None = None
    sample_from_anchor: Flag | None = None


class LegacyDrafterFile(BaseModel):
    """dspark_config.json, the older layout: DraftConfig's own fields."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: Count(1, VOCAB_MAX)
    hidden_size: Count(1, HIDDEN_MAX)
    target_layers: LayerIds
    block_size: Count(1, BLOCK_MAX) = 7
    head: str = "markov"
    markov_rank: Count(1, RANK_MAX) = 256
    num_layers: Count(1, DRAFT_LAYERS_MAX) = 2
    num_heads: Count(1, HEADS_MAX) = 4
    num_kv_heads: Count(1, HEADS_MAX) = 2
    head_dim: Count(1, HEAD_DIM_MAX) = 32
    intermediate_size: Count(1, INTERMEDIATE_MAX) = 512
    rms_norm_eps: Annotated[float, Field(strict=True, gt=0, lt=1, allow_inf_nan=False)] = 1e-6
    rope_theta: Annotated[float, Field(strict=True, gt=1, allow_inf_nan=False)] = 10000.0
    mask_token_id: Count(0, VOCAB_MAX - 1) | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


def check_engine_file(data: Any, where: str) -> EngineDrafterFile:
    """An engine-layout drafter config, typed and bounded; ConfigError (one line naming `where`) otherwise."""
    return validate_decoder(data, where, EngineDrafterFile, FIX)


def check_legacy_file(data: Any, where: str) -> LegacyDrafterFile:
    """An older-layout drafter config, typed and bounded; ConfigError (one line naming `where`) otherwise."""
    return validate_decoder(data, where, LegacyDrafterFile, FIX)
