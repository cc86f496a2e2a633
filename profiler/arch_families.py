"""The architectures whose layers are not all alike: gpt-oss, Llama-4, DeepSeek-V4, Gemma-4, Qwen3-Next.

profiler/arch.py reads the uniform families itself (every layer the same attention, a dense or MoE MLP). The families
here differ layer by layer (sliding / full / compressed / linear attention, dense and MoE MLPs side by side, hyper-
connections), so each reader below sums what transformers 5.25 builds for them (models/<family>/modeling_*.py) into
the ArchSpec's exact totals: `attn_params` (attention of all layers), `extra_params` (parameters outside the standard
parts), `kv_elems_per_token` (cache elements a token adds over all layers), `state_elems` (per-request state that does
not grow with the context) and `attn_ctx_flops` (decode attention FLOPs per context token). The totals equal
transformers' parameter count on the meta device (tests/profiler/test_new_models.py checks the published figures;
the equality was checked when the readers were written, see docs/drafters.md "Model catalogue").
"""

from __future__ import annotations

from typing import Any

from profiler.errors import ProfileError


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ProfileError(f"{where}: config has no '{key}'; add it (see the model's config.json on the Hub)")
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ProfileError(f"{where}: '{key}' must be a non-negative integer, got {v!r}")
    return v


def _layer_types(cfg: dict[str, Any], n: int, where: str) -> list[str]:
    lt = cfg.get("layer_types")
    if lt is None:
        return []
    if not isinstance(lt, list) or len(lt) < n or not all(isinstance(t, str) for t in lt[:n]):
        raise ProfileError(f"{where}: 'layer_types' must list one string per layer ({n})")
    return list(lt[:n])


def gpt_oss(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """gpt-oss: every layer MoE (experts and router with biases), q/k/v/o biases, one attention sink per head,
    sliding (128) and full attention alternating (layer_types)."""
    n, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    types = _layer_types(cfg, n, where)
    return {"moe_layers": tuple(range(n)), "expert_bias": True, "router_bias": True,
            "extra_params": n * heads,  # self_attn.sinks
            "sliding_layers": sum(t == "sliding_attention" for t in types) if types else 0,
            "moe_intermediate": int(cfg["intermediate_size"])}


def llama4(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """Llama-4 text model: MoE every `interleave_moe_layer_step`-th layer (16/128 experts of `intermediate_size`,
    top-1, plus one shared expert of the same width), dense layers of `intermediate_size_mlp`; chunked local
    attention (`attention_chunk_size`) on three layers of four (every fourth is global NoPE), modelled as a window."""
    n = cfg["num_hidden_layers"]
    step = _int(cfg, "interleave_moe_layer_step", where, 1) or 1
    inter = int(cfg["intermediate_size"])
    chunk = cfg.get("attention_chunk_size")
    return {"moe_layers": tuple(range(step - 1, n, step)), "moe_intermediate": inter, "shared_intermediate": inter,
            "dense_intermediate": int(cfg.get("intermediate_size_mlp") or inter),
            "sliding_window": int(chunk) if chunk else None,
            "sliding_layers": sum(1 for i in range(n) if (i + 1) % 4) if chunk else 0,
            "qk_norm": False}  # use_qk_norm is a weightless L2 norm: no parameters


def deepseek_v4(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """DeepSeek-V4: one 512-wide KV head shared by all query heads (K = V, the last 64 dims roped), q through a
    low-rank `q_lora_rank`, grouped low-rank output (`o_groups` x `o_lora_rank`), a learned sink per head; per layer
    (`compress_ratios`, 0 / 4 / 128) a 128-token sliding window plus, on CSA (4) layers, entries compressed 4:1 and
    picked by a lightning indexer (its own q projection, compressor and weights), on HCA (128) layers entries
    compressed 128:1; manifold-constrained hyper-connections (mHC, `hc_mult` residual streams) around attention and
    FFN; every layer MoE (routed + shared experts), the first `num_hash_layers` routed by a token hash (no score bias).
    """
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads, hd = cfg["num_attention_heads"], _int(cfg, "head_dim", where)
    q_lora, o_lora = _int(cfg, "q_lora_rank", where), _int(cfg, "o_lora_rank", where)
    groups, rope = _int(cfg, "o_groups", where), _int(cfg, "qk_rope_head_dim", where)
    ih, ihd = _int(cfg, "index_n_heads", where), _int(cfg, "index_head_dim", where)
    topk, window = _int(cfg, "index_topk", where), _int(cfg, "sliding_window", where)
    hc = _int(cfg, "hc_mult", where, 1)
    experts, n_hash = _int(cfg, "n_routed_experts", where), _int(cfg, "num_hash_layers", where, 0)
    ratios = cfg.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < n or any(r not in (0, 4, 128) for r in ratios[:n]):
        raise ProfileError(f"{where}: 'compress_ratios' must give 0, 4 or 128 for each of the {n} layers")
    ratios = ratios[:n]
    base = (h * q_lora + q_lora + q_lora * heads * hd  # q_a, q_a_norm, q_b
            + h * hd + hd  # kv_proj, kv_norm (one head, K = V)
            + (heads * hd // groups) * groups * o_lora + groups * o_lora * h  # o_a (grouped), o_b
            + heads)  # sinks
    attn = kv = ctx_flops = 0.0
    per_query = 2.0 * heads * (hd + hd)  # scores over the 512-wide entry + the same entry as value
    for r in ratios:
        attn += base
        if r == 4:  # CSA: overlapping compressor (2 x hd) + lightning indexer
            attn += 2 * h * 2 * hd + r * 2 * hd + hd
            attn += 2 * h * 2 * ihd + r * 2 * ihd + ihd + q_lora * ih * ihd + h * ih
            kv += hd / r + ihd / r
            ctx_flops += per_query / r + 2.0 * ih * ihd / r  # attention over ctx/4 entries + the indexer's scan
        elif r == 128:  # HCA compressor
            attn += 2 * h * hd + r * hd + hd
            kv += hd / r
            ctx_flops += per_query / r
    mix = (2 + hc) * hc
    mhc = n * 2 * (mix * hc * h + mix + 3) + (hc * hc * h + hc + 1)  # per-layer attn/ffn hc + the hyper head
    return {"attn_params": int(attn), "extra_params": int(mhc + experts * (n - min(n, n_hash))),  # + score biases
            "moe_layers": tuple(range(n)), "kv_elems_per_token": kv, "attn_ctx_flops": ctx_flops,
            "state_elems": float(n * window * hd), "kv_lora_rank": hd, "qk_rope_head_dim": rope,
            "q_lora_rank": q_lora, "qk_nope_head_dim": hd - rope, "v_head_dim": hd,
            "sliding_window": window, "index_topk": topk,
            "csa_layers": sum(r == 4 for r in ratios), "hca_layers": sum(r == 128 for r in ratios)}


def gemma4(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """Gemma-4 text model: sliding layers (`head_dim`, `num_key_value_heads`) and global layers (`global_head_dim`,
    `num_global_key_value_heads`, K = V with `attention_k_eq_v`: no v_proj, one cached tensor), q/k norms, four
    norms around attention and FFN; with `enable_moe_block` every layer runs its dense MLP and a routed MoE side by
    side (three more norms, a router with a per-dim scale and a per-expert scale)."""
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    hd, kvh = int(cfg.get("head_dim") or 256), int(cfg.get("num_key_value_heads") or heads)
    ghd = int(cfg.get("global_head_dim") or hd)
    gkv = int(cfg.get("num_global_key_value_heads") or kvh)
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    types = _layer_types(cfg, n, where) or ["sliding_attention"] * n
    moe = bool(cfg.get("enable_moe_block")) and bool(cfg.get("num_experts"))
    experts = int(cfg.get("num_experts") or 0)
    attn = kv = flops = 0
    for t in types:
        d, k = (ghd, gkv) if t == "full_attention" else (hd, kvh)
        v = 0 if (t == "full_attention" and k_eq_v) else h * k * d
        attn += h * heads * d + h * k * d + v + heads * d * h + 2 * d  # q, k, v, o, q_norm, k_norm
        kv += (1 if v == 0 else 2) * k * d
        flops += 4 * heads * d
    norms = 4 + (3 if moe else 0)
    extra = n * ((norms - 2) * h)  # beyond the two norms per layer ArchSpec counts
    if moe:
        extra += n * (h + experts)  # router.scale, router.per_expert_scale
    return {"attn_params": attn, "extra_params": extra, "kv_elems_per_token": float(kv), "attn_ctx_flops": float(flops),
            "moe_layers": tuple(range(n)) if moe else (), "dense_mlp_in_moe_layers": moe,
            "experts_per_token": int(cfg.get("top_k_experts") or 0) if moe else 0,
            "moe_intermediate": int(cfg.get("moe_intermediate_size") or 0) if moe else 0,
            "sliding_window": cfg.get("sliding_window"),
            "sliding_layers": sum(t == "sliding_attention" for t in types), "qk_norm": False}


def qwen3_next(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """Qwen3-Next: gated attention every `full_attention_interval`-th layer (q_proj doubled for the output gate,
    q/k norms), Gated DeltaNet elsewhere (no KV cache: a per-request recurrent state and a conv state), MoE in every
    layer (`num_experts` of `moe_intermediate_size`, a gated shared expert)."""
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads, hd = cfg["num_attention_heads"], int(cfg.get("head_dim") or 256)
    kvh = int(cfg.get("num_key_value_heads") or heads)
    every = _int(cfg, "full_attention_interval", where, 4) or 4
    types = _layer_types(cfg, n, where) or ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                                            for i in range(n)]
    nk, kd = _int(cfg, "linear_num_key_heads", where), _int(cfg, "linear_key_head_dim", where)
    nv, vd = _int(cfg, "linear_num_value_heads", where), _int(cfg, "linear_value_head_dim", where)
    conv = _int(cfg, "linear_conv_kernel_dim", where, 4)
    key_dim, value_dim = nk * kd, nv * vd
    conv_dim = 2 * key_dim + value_dim
    full = sum(t == "full_attention" for t in types)
    linear = n - full
    full_attn = h * heads * hd * 2 + 2 * h * kvh * hd + heads * hd * h + 2 * hd  # q (+ gate), k, v, o, q/k norms
    lin_attn = (h * (2 * key_dim + 2 * value_dim) + h * 2 * nv + conv_dim * conv + 2 * nv + vd + value_dim * h)
    return {"attn_params": full * full_attn + linear * lin_attn, "kv_elems_per_token": float(full * 2 * kvh * hd),
            "attn_ctx_flops": float(full * 4 * heads * hd),
            "state_elems": float(linear * (nv * kd * vd + conv_dim * (conv - 1))),
            "moe_layers": tuple(range(n)), "shared_intermediate": int(cfg.get("shared_expert_intermediate_size") or 0),
            "shared_expert_gate": bool(cfg.get("shared_expert_intermediate_size")), "linear_attn_layers": linear,
            "qk_norm": False}  # the full layers' q/k norms are in attn_params


def vision_params(vc: dict[str, Any]) -> int:
    """An approximate vision-tower count (blocks of attention + MLP at the tower's width, patch projection, position
    table) for towers whose exact layout the reader does not model (Kimi-K2.5's MoonViT, Gemma-4's vision encoder).
    Only params_total uses it; nothing priced per token reads the vision tower."""
    h = int(vc.get("hidden_size") or vc.get("vt_hidden_size") or 0)
    inter = int(vc.get("intermediate_size") or vc.get("vt_intermediate_size") or 0)
    layers = int(vc.get("num_hidden_layers") or vc.get("vt_num_hidden_layers") or 0)
    patch = int(vc.get("patch_size") or 14)
    mlp = 3 if str(vc.get("model_type", "")).startswith("gemma4") else 2  # gated MLP vs fc1 / fc2
    return layers * (4 * h * h + mlp * h * inter) + 3 * patch * patch * h
