"""Read a Hugging Face config.json (any family, any transformers version) into one ArchSpec.

Real configs spell the same thing differently: ``num_experts`` (Qwen-MoE) vs ``num_local_experts``
(Mixtral) vs ``n_routed_experts`` (DeepSeek); ``head_dim`` present, null or derived from
``hidden_size / num_attention_heads``; ``torch_dtype`` (transformers 4) vs ``dtype`` (5);
``rope_theta`` vs ``rope_parameters``; multimodal configs nest the language model in
``text_config``. This module applies the same defaults transformers' config classes apply, so
that a count computed here equals the parameter count of the model transformers would build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profiler.config_check import ProfilerConfig, TopLevel, VisionConfig, check
from profiler.errors import ProfileError

# model_type -> (family, per-family defaults as transformers' config classes set them)
_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}),
    "mistral": ("mistral", {"tie_word_embeddings": False}),
    "mixtral": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False}),
    "qwen2": ("qwen2", {"tie_word_embeddings": False}),
    "qwen2_moe": ("qwen2_moe", {"tie_word_embeddings": False, "decoder_sparse_step": 1,
                                "num_experts_per_tok": 4}),
    "qwen3": ("qwen3", {"attention_bias": False, "tie_word_embeddings": False, "head_dim": 128}),
    "qwen3_moe": ("qwen3", {"attention_bias": False, "tie_word_embeddings": False, "decoder_sparse_step": 1,
                            "num_experts": 128, "num_experts_per_tok": 8}),
    "gemma": ("gemma", {"tie_word_embeddings": True, "head_dim": 256}),
    "gemma2": ("gemma2", {"tie_word_embeddings": True, "head_dim": 256}),
    "gemma3_text": ("gemma3", {"tie_word_embeddings": True, "head_dim": 256, "vocab_size": 262208}),
    "deepseek_v3": ("deepseek_v3", {"tie_word_embeddings": False, "first_k_dense_replace": 3,
                                    "n_shared_experts": 1, "moe_layer_freq": 1, "num_experts_per_tok": 8}),
    "deepseek_v2": ("deepseek_v2", {"tie_word_embeddings": False, "first_k_dense_replace": 0,
                                    "moe_layer_freq": 1}),
    # Kimi-K2.x ships model_type kimi_k2 with DeepSeek-V3's architecture (architectures: DeepseekV3ForCausalLM)
    "kimi_k2": ("deepseek_v3", {"tie_word_embeddings": False, "first_k_dense_replace": 3,
                                "n_shared_experts": 1, "moe_layer_freq": 1, "num_experts_per_tok": 8}),
    # families whose layers differ: profiler/arch_families.py sums them
    "gpt_oss": ("gpt_oss", {"tie_word_embeddings": False, "num_local_experts": 32, "num_experts_per_tok": 4}),
    "llama4_text": ("llama4", {"tie_word_embeddings": False, "interleave_moe_layer_step": 1}),
    "deepseek_v4": ("deepseek_v4", {"tie_word_embeddings": False, "n_shared_experts": 1, "num_hash_layers": 0}),
    "gemma4_text": ("gemma4", {"tie_word_embeddings": True, "head_dim": 256}),
    "qwen3_next": ("qwen3_next", {"tie_word_embeddings": False, "decoder_sparse_step": 1}),
}
_ARCH_TO_TYPE = {  # `architectures[0]` -> model_type, for configs that lack model_type
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
    "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2",
    "GptOssForCausalLM": "gpt_oss", "Llama4ForConditionalGeneration": "llama4", "DeepseekV4ForCausalLM": "deepseek_v4",
    "Gemma4ForConditionalGeneration": "gemma4", "Qwen3NextForCausalLM": "qwen3_next",
    "KimiK25ForConditionalGeneration": "kimi_k25",
}
# model types whose language model sits in `text_config` (the vision tower beside it)
_MULTIMODAL = {"gemma3", "gemma4", "llama4", "kimi_k25"}


@dataclass(frozen=True)
class ArchSpec:
    """The architecture facts the counts need; every field is what transformers would build."""

    model_type: str  # transformers model_type of the language model, e.g. "qwen3_moe"
    family: str  # our family key: qwen3, qwen2, llama, mistral, mixtral, gemma2, gemma3, deepseek_v3
    num_layers: int  # decoder layers
    hidden: int  # model width
    intermediate: int  # dense MLP width
    vocab: int  # vocabulary (embedding rows)
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (== num_heads for MLA, which caches a latent instead)
    head_dim: int  # per-head width of q/k/v (MLA: qk_nope + qk_rope)
    tied: bool  # LM head shares the embedding matrix
    qkv_bias: bool  # bias on q/k/v projections (Qwen2, Llama attention_bias)
    o_bias: bool  # bias on the output projection (Llama attention_bias)
    mlp_bias: bool  # bias on gate/up/down (Llama mlp_bias)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3, Gemma-3)
    norms_per_layer: int  # RMSNorms per decoder layer: 2 (pre-norm) or 4 (Gemma-2/3 sandwich)
    act: str  # gate activation: "silu" (SwiGLU) or "gelu" (GeGLU)
    max_context: int | None  # max_position_embeddings
    dtype: str  # checkpoint dtype
    # MoE
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0  # routed experts chosen per token
    moe_intermediate: int = 0  # width of one routed expert
    shared_intermediate: int = 0  # total width of the always-on shared expert(s)
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias (one per expert)
    moe_layers: tuple[int, ...] = ()  # indices of decoder layers whose MLP is MoE
    # MLA (DeepSeek-V2/V3)
    q_lora_rank: int = 0  # 0: plain q projection
    kv_lora_rank: int = 0  # 0: not MLA
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # extras
    sliding_window: int | None = None  # local-attention window of the sliding layers, if any
    sliding_layers: int = 0  # how many layers attend only within `sliding_window`
    vision_params: int = 0  # parameters of a vision tower + projector (multimodal checkpoints)
    # layer-by-layer architectures (profiler/arch_families.py); 0 / False: the uniform formulas apply
    attn_params: int = 0  # attention parameters summed over all layers, when layers differ
    extra_params: int = 0  # parameters outside the standard parts (sinks, hyper-connections, extra norms, scales)
    expert_bias: bool = False  # routed experts carry biases (gpt-oss)
    dense_mlp_in_moe_layers: bool = False  # MoE layers also run the dense MLP (Gemma-4's enable_moe_block)
    kv_elems_per_token: float = 0.0  # cache elements one token adds over all layers (compressed / hybrid caches)
    state_elems: float = 0.0  # per-request cache state that does not grow with context (recurrent state, windows)
    attn_ctx_flops: float = 0.0  # decode attention FLOPs per token per context token, summed over layers
    linear_attn_layers: int = 0  # layers without a KV cache (linear / recurrent attention)
    mtp_modules: int = 0  # multi-token-prediction modules shipped with the checkpoint (num_nextn_predict_layers)
    notes: tuple[str, ...] = field(default=())  # what the reader inferred or defaulted

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention(self) -> str:
        if self.is_mla:
            return "mla"
        if self.num_kv_heads == self.num_heads:
            return "mha"
        return "mqa" if self.num_kv_heads == 1 else "gqa"

    def signature(self) -> str:
        """What the operator census depends on (structure, not sizes): one census per signature."""
        parts = [
            self.family, self.attention if self.attention != "mqa" else "gqa",
            f"qkvb{int(self.qkv_bias)}", f"ob{int(self.o_bias)}", f"qkn{int(self.qk_norm)}",
            f"n{self.norms_per_layer}", self.act, f"moe{int(self.is_moe)}",
            f"sh{int(self.shared_intermediate > 0)}", f"mla{int(self.is_mla)}", f"ql{int(self.q_lora_rank > 0)}",
        ]
        return "-".join(parts)


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """First non-null value among ``keys``."""
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def _need(cfg: dict[str, Any], key: str, where: str) -> int:
    v = cfg.get(key)
    if v is None:
        raise ProfileError(f"{where}: config has no '{key}'; add it (see the model's config.json on the Hub)")
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ProfileError(f"{where}: '{key}' must be a positive integer, got {v!r}")
    return v


def _vision_params(vc: VisionConfig, text_hidden: int) -> int:
    """SigLIP vision tower + Gemma-3 projector, as transformers builds them."""
    h, inter, layers = vc.hidden_size, vc.intermediate_size, vc.num_hidden_layers
    patch, image, channels = vc.patch_size, vc.image_size, vc.num_channels
    per_layer = 4 * (h * h + h) + (h * inter + inter) + (inter * h + h) + 2 * 2 * h  # attn, mlp, 2 LayerNorms
    patches = (image // patch) ** 2
    embed = channels * patch * patch * h + h + patches * h  # patch conv + bias + position embedding
    tower = layers * per_layer + embed + 2 * h  # + post LayerNorm
    if vc.vision_use_head:  # SigLIP attention-pooling head (Gemma-3 checkpoints drop it)
        tower += h + (4 * h * h + 4 * h) + 2 * h + (h * inter + inter) + (inter * h + h)
    projector = h * text_hidden + h  # mm_input_projection_weight + mm_soft_emb_norm
    return tower + projector


def read_config(raw: dict[str, Any], where: str = "config.json") -> ArchSpec:
    """Normalise one config.json dict; raises ProfileError (one line) on an unknown architecture."""
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    check(TopLevel, raw, where)  # types of what is read before the language model's config is found
    model_type = raw.get("model_type")
    if model_type is None:
        archs = raw.get("architectures") or []
        model_type = next((_ARCH_TO_TYPE[a] for a in archs if a in _ARCH_TO_TYPE), None)
    notes: list[str] = []
    cfg = raw
    vision = 0
    vision_cfg: VisionConfig | None = None
    other_vision: dict[str, Any] | None = None  # a non-SigLIP tower, counted approximately (arch_families)
    if model_type in _MULTIMODAL:
        text = dict(raw.get("text_config") or {})
        if not text:
            raise ProfileError(f"{where}: multimodal '{model_type}' config has no text_config")
        check(TopLevel, text, f"{where}: text_config")
        model_type = text.get("model_type") or f"{model_type}_text"
        vc = raw.get("vision_config")
        if vc and model_type == "gemma3_text":
            vision_cfg = check(VisionConfig, vc, f"{where}: vision_config")
            notes.append("vision tower counted in params_total, not in params_active")
        elif isinstance(vc, dict):
            other_vision = check(VisionConfig, vc, f"{where}: vision_config").model_dump() | vc
            notes.append("vision tower counted approximately in params_total (attention + MLP blocks at its width), "
                         "not in params_active")
        cfg = {**text, "torch_dtype": raw.get("torch_dtype", raw.get("dtype"))}
    if model_type not in _FAMILIES:
        known = ", ".join(sorted(_FAMILIES))
        raise ProfileError(f"{where}: unknown architecture (model_type={model_type!r}, "
                           f"architectures={raw.get('architectures')!r}); supported model types: {known}")
    family, defaults = _FAMILIES[model_type]
    cfg = {**defaults, **{k: v for k, v in cfg.items() if v is not None}}
    if family == "deepseek_v4" and "intermediate_size" not in cfg:  # every layer is MoE: no dense width
        cfg["intermediate_size"] = cfg.get("moe_intermediate_size")
    rope = cfg.get("rope_scaling")
    if (family == "llama4" and isinstance(rope, dict) and rope.get("rope_type") == "llama3"
            and rope.get("high_freq_factor") is not None
            and rope.get("high_freq_factor") == rope.get("low_freq_factor")):
        # Llama-4-Scout's published rope_scaling has high_freq_factor == low_freq_factor (1.0): transformers accepts it
        # with a warning, the engine's bound refuses it; nothing here reads RoPE scaling, so the rest is checked
        check(ProfilerConfig, {k: v for k, v in cfg.items() if k != "rope_scaling"}, where)
        notes.append("rope_scaling has high_freq_factor == low_freq_factor (as published); not read")
    else:
        check(ProfilerConfig, cfg, where)  # every field read below is typed and bounded from here on
    if vision_cfg is not None:
        vision = _vision_params(vision_cfg, int(cfg["hidden_size"]))
    elif other_vision is not None:
        from profiler.arch_families import vision_params

        vision = vision_params(other_vision)

    hidden = _need(cfg, "hidden_size", where)
    layers = _need(cfg, "num_hidden_layers", where)
    heads = _need(cfg, "num_attention_heads", where)
    vocab = _need(cfg, "vocab_size", where)
    inter = _need(cfg, "intermediate_size", where)
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    if cfg.get("head_dim"):
        head_dim = int(cfg["head_dim"])
    else:
        head_dim = hidden // heads
        notes.append(f"head_dim derived as hidden_size/num_attention_heads = {head_dim}")
    dtype = str(_get(raw, "dtype", "torch_dtype", default=_get(cfg, "dtype", "torch_dtype", default="bfloat16")))
    act = str(_get(cfg, "hidden_activation", "hidden_act", default="silu"))
    act = "gelu" if act.startswith("gelu") else "silu"

    qkv_bias = o_bias = False
    if family in ("qwen2", "qwen2_moe"):
        qkv_bias = True  # Qwen2 always has q/k/v bias and no o bias
    elif family in ("llama", "qwen3", "gemma", "gemma2", "gemma3", "deepseek_v3", "deepseek_v2", "gpt_oss",
                    "llama4", "gemma4", "qwen3_next", "deepseek_v4"):
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False)) if family == "llama" else False

    # MoE, three spellings
    num_experts = int(_get(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0) or 0)
    top_k = int(_get(cfg, "num_experts_per_tok", "top_k_experts", default=0) or 0) if num_experts else 0
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter)) if num_experts else 0
    shared = 0
    shared_gate = False
    moe_layers: tuple[int, ...] = ()
    if num_experts:
        if family == "mixtral":
            moe_layers = tuple(range(layers))
        elif family in ("qwen3", "qwen2_moe"):
            step = int(cfg.get("decoder_sparse_step", 1))
            dense_only = set(cfg.get("mlp_only_layers") or [])
            moe_layers = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
            if family == "qwen2_moe":
                shared = int(cfg.get("shared_expert_intermediate_size", 0))
                shared_gate = shared > 0
        elif family in ("deepseek_v3", "deepseek_v2"):
            first = int(cfg.get("first_k_dense_replace", 0))
            freq = int(cfg.get("moe_layer_freq", 1))
            moe_layers = tuple(i for i in range(layers) if i >= first and i % freq == 0)
            shared = int(cfg.get("n_shared_experts") or 0) * moe_inter
        if not top_k:
            raise ProfileError(f"{where}: MoE config has {num_experts} experts but no 'num_experts_per_tok'")

    q_lora = kv_lora = nope = rope = v_dim = 0
    if family in ("deepseek_v3", "deepseek_v2"):
        q_lora = int(cfg.get("q_lora_rank") or 0)
        kv_lora = _need(cfg, "kv_lora_rank", where)
        nope = _need(cfg, "qk_nope_head_dim", where)
        rope = _need(cfg, "qk_rope_head_dim", where)
        v_dim = _need(cfg, "v_head_dim", where)
        head_dim = nope + rope
        kv_heads = heads
        notes = [n for n in notes if not n.startswith("head_dim derived")]  # MLA: q/k width is nope + rope

    window = cfg.get("sliding_window") if family in ("gemma2", "gemma3", "mistral", "mixtral") else None
    sliding = 0
    if window:
        if family == "gemma2":  # transformers: layer i slides when (i + 1) % 2 != 0
            sliding = sum(1 for i in range(layers) if (i + 1) % 2)
        elif family == "gemma3":  # five local layers to one global (sliding_window_pattern)
            pattern = int(cfg.get("sliding_window_pattern", 6))
            sliding = sum(1 for i in range(layers) if (i + 1) % pattern)
        else:
            sliding = layers
    fields: dict[str, Any] = dict(
        model_type=model_type, family=family, num_layers=layers, hidden=hidden, intermediate=inter,
        vocab=vocab, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        tied=bool(cfg.get("tie_word_embeddings", True)), qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
        qk_norm=family in ("qwen3", "gemma3"), norms_per_layer=4 if family in ("gemma2", "gemma3") else 2,
        act=act, max_context=cfg.get("max_position_embeddings"), dtype=dtype,
        num_experts=num_experts, experts_per_token=top_k, moe_intermediate=moe_inter,
        shared_intermediate=shared, shared_expert_gate=shared_gate,
        router_bias=family == "deepseek_v3" and num_experts > 0, moe_layers=moe_layers,
        q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
        v_head_dim=v_dim, sliding_window=int(window) if window else None, sliding_layers=sliding,
        vision_params=vision, mtp_modules=int(cfg.get("num_nextn_predict_layers") or 0),
    )
    if family in _LAYERWISE:
        from profiler import arch_families

        extra = getattr(arch_families, family)(cfg, where)
        if "dense_intermediate" in extra:
            fields["intermediate"] = extra.pop("dense_intermediate")
        for k in ("index_topk", "csa_layers", "hca_layers"):  # DeepSeek-V4 facts the counts already used
            extra.pop(k, None)
        if family == "deepseek_v4":
            extra["shared_intermediate"] = int(cfg.get("n_shared_experts") or 0) * moe_inter
            notes.append("DeepSeek-V4: the KV cache is the compressed entries (CSA 1:4 + indexer keys, HCA 1:128); "
                         "the 128-token sliding window is per-request state; attention FLOPs over CSA entries are "
                         "not capped at index_topk")
        if family == "llama4" and extra.get("sliding_window"):
            notes.append("Llama-4: chunked local attention (attention_chunk_size) modelled as a sliding window")
        fields.update(extra)
        if fields.get("sliding_window") is not None:
            fields["sliding_window"] = int(fields["sliding_window"])
    return ArchSpec(**fields, notes=tuple(notes))


_LAYERWISE = ("gpt_oss", "llama4", "deepseek_v4", "gemma4", "qwen3_next")  # read by profiler/arch_families.py
