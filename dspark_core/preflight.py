"""The engine's memory check before it loads anything: target weights + KV cache + drafter, from the configs alone.

Engine.__init__ calls `preflight` first, so a config whose sizes are in bounds but multiply past the machine (a
long `model.max_seq_len` times many `batch.max_requests`, a huge vocabulary times a wide model, a drafter's vocab x
rank Markov matrices) is refused with one line naming the estimate and what to lower, before a byte is allocated.
The loaders check their own parts again (load_model, load_drafter) for the commands that call them directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_core.memory import ensure_fits, kv_bytes

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig
    from dspark_core.modeling.arch import ArchConfig

KV_BYTES = {"bf16": 2, "fp16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}  # kv.dtype -> bytes per element (auto: weights')
FIX = ("lower batch.max_requests or model.max_seq_len, use kv.dtype fp8_e4m3 or weights.dtype bf16, or a smaller "
       "model or drafter")


def engine_parts(config: EngineConfig, target: ArchConfig | None, with_drafter: bool = True) -> dict[str, int]:
    """Bytes the engine of `config` will allocate, by part. `target`: the loaded target's architecture (its weights
    are then already in memory and not counted), or None to read config.json; `with_drafter`: count the drafter the
    config names (False when the caller passes one in)."""
    from dspark_core.modeling.arch import ArchConfig
    from dspark_core.modeling.checkpoint import checkpoint_folder, resolve_device, resolve_dtype

    dev = resolve_device(config.device)
    elem = resolve_dtype(config.weights.dtype, dev).itemsize
    parts: dict[str, int] = {}
    arch = target
    if arch is None:
        arch = ArchConfig.from_file(checkpoint_folder(config.model.path))
        parts["target weights"] = arch.num_params() * elem
    slots, positions = config.batch.max_requests, config.model.max_seq_len
    kv_elem = KV_BYTES.get(config.kv.dtype, elem)
    parts["KV cache"] = kv_bytes(arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim, slots, positions,
                                 kv_elem)
    if not (with_drafter and config.spec.enabled):
        return parts
    if config.drafter.method in ("dspark", "hybrid"):
        from dspark_core.drafters.dspark_layout import read_drafter_config
        from dspark_core.drafters.dspark_runtime import drafter_folder

        d = read_drafter_config(drafter_folder(config))
        parts["drafter"] = d.num_params() * elem + kv_bytes(d.num_layers, d.num_kv_heads, d.head_dim, slots,
                                                            positions, elem)
    elif config.drafter.method == "ar_draft" and config.drafter.path:
        draft = ArchConfig.from_file(checkpoint_folder(config.drafter.path))
        parts["draft model"] = draft.num_params() * elem + kv_bytes(
            draft.num_hidden_layers, draft.num_key_value_heads, draft.head_dim, slots, positions, elem)
    return parts


def preflight(config: EngineConfig, target: ArchConfig | None = None, with_drafter: bool = True) -> None:
    """Refuse (one DSparkError line) an engine whose estimated memory does not fit the device (dspark_core/memory)."""
    from dspark_core.modeling.checkpoint import resolve_device

    parts = engine_parts(config, target, with_drafter)
    ensure_fits(parts, resolve_device(config.device), f"the engine for {config.model.path}", FIX)
