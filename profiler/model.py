"""Architecture -> parameter counts, weight and KV bytes, FLOPs per token, arithmetic intensity.

Everything here is computed from an ArchSpec (profiler/arch.py), never copied from a model
card; tests compare the results with the published figures and with transformers itself.

Conventions (stated once, used everywhere):
- ``params_active`` counts every parameter a token passes through, with MoE layers contributing
  only their router, top-k routed experts and shared experts; both embedding matrices count in
  full (the Qwen and Mistral convention), a vision tower does not.
- FLOPs are 2 per multiply-accumulate. The linear part uses the active matrices (the LM head
  included, the input embedding lookup excluded); the attention part is QK^T plus AV over the
  context, window-limited on sliding-window layers. MLA decode uses the absorbed form (scores
  over the 512-wide latent + the RoPE part), MLA prefill the expanded form.
- Quantised weight bytes quantise the decoder's linear layers only; embeddings, LM head and
  norms stay bf16, as fp8/int8/int4 checkpoints ship them.
"""

from __future__ import annotations

from dataclasses import dataclass

from profiler.arch import ArchSpec

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
# scale overhead per quantised weight: fp8 one fp32 scale per 128x128 block (DeepSeek/sglang block
# quant), int8 one fp16 scale per 128-weight group... written per weight in bytes
SCALE_BYTES = {"bf16": 0.0, "fp8": 4.0 / (128 * 128), "int8": 2.0 / 128, "int4": 4.0 / 128}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by part; every total below is derived from these."""

    attn_per_layer: int  # attention projections + biases + q/k norms (+ MLA latent norms)
    norms_per_layer: int  # the layer's RMSNorm weights
    dense_mlp: int  # one dense MLP block
    expert: int  # one routed expert (gate, up, down)
    router: int  # one MoE router (+ correction bias)
    shared: int  # shared expert(s) of one MoE layer (+ its gate)
    embedding: int  # input embedding matrix
    lm_head: int  # separate LM head (0 when tied)
    final_norm: int
    vision: int  # vision tower + projector
    num_dense_layers: int
    num_moe_layers: int
    experts: int  # routed experts per MoE layer
    top_k: int
    attn_all: int = -1  # attention of all layers when they differ (-1: layers x attn_per_layer)
    extra: int = 0  # parameters outside these parts (sinks, hyper-connections, extra norms), all active
    dense_mlp_layers: int = -1  # layers that run the dense MLP (-1: the dense layers)

    @property
    def moe_layer_total(self) -> int:
        return self.router + self.experts * self.expert + self.shared

    @property
    def moe_layer_active(self) -> int:
        return self.router + self.top_k * self.expert + self.shared

    @property
    def attn_total(self) -> int:
        n = self.num_dense_layers + self.num_moe_layers
        return self.attn_all if self.attn_all >= 0 else n * self.attn_per_layer

    @property
    def layers_common(self) -> int:
        """Attention and norms of all layers plus the dense MLPs (and what else every token passes through)."""
        n = self.num_dense_layers + self.num_moe_layers
        mlp_layers = self.dense_mlp_layers if self.dense_mlp_layers >= 0 else self.num_dense_layers
        return self.attn_total + n * self.norms_per_layer + mlp_layers * self.dense_mlp + self.extra

    @property
    def total(self) -> int:
        return (self.layers_common + self.num_moe_layers * self.moe_layer_total + self.embedding
                + self.lm_head + self.final_norm + self.vision)

    @property
    def active(self) -> int:
        return (self.layers_common + self.num_moe_layers * self.moe_layer_active + self.embedding
                + self.lm_head + self.final_norm)

    @property
    def linear_active(self) -> int:
        """Matrix parameters a token multiplies by (LM head included, lookup and norms excluded)."""
        n = self.num_dense_layers + self.num_moe_layers
        head = self.lm_head or self.embedding  # a tied head still multiplies by the V x h matrix
        return (self.layers_common - n * self.norms_per_layer + self.num_moe_layers * self.moe_layer_active
                + head)

    @property
    def non_decoder(self) -> int:
        """Embedding, LM head, final norm and vision: kept in bf16 when the decoder is quantised."""
        return self.embedding + self.lm_head + self.final_norm + self.vision


def count_params(s: ArchSpec) -> ParamCounts:
    """Count parameters part by part, the way transformers lays the modules out."""
    h = s.hidden
    if s.is_mla:
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank:
            q = h * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * s.num_heads * qk  # q_a, q_a_norm, q_b
        else:
            q = h * s.num_heads * qk
        kv = (h * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank  # kv_a_proj_with_mqa, kv_a_norm
              + s.kv_lora_rank * s.num_heads * (s.qk_nope_head_dim + s.v_head_dim))  # kv_b_proj
        o = s.num_heads * s.v_head_dim * h
        attn = q + kv + o + (0 if not s.o_bias else h)
    else:
        q_out = s.num_heads * s.head_dim
        kv_out = s.num_kv_heads * s.head_dim
        attn = h * q_out + 2 * h * kv_out + q_out * h
        if s.qkv_bias:
            attn += q_out + 2 * kv_out
        if s.o_bias:
            attn += h
        if s.qk_norm:
            attn += 2 * s.head_dim
    dense_mlp = 3 * h * s.intermediate + ((2 * s.intermediate + h) if s.mlp_bias else 0)
    n_moe = len(s.moe_layers) if s.is_moe else 0
    expert = 3 * h * s.moe_intermediate + ((2 * s.moe_intermediate + h) if s.expert_bias else 0) if n_moe else 0
    router = (s.num_experts * h + (s.num_experts if s.router_bias else 0)) if n_moe else 0
    shared = (3 * h * s.shared_intermediate + (h if s.shared_expert_gate else 0)) if n_moe else 0
    attn_all = s.attn_params if s.attn_params else -1
    if attn_all > 0:
        attn = attn_all // max(1, s.num_layers)
    return ParamCounts(
        attn_per_layer=attn, norms_per_layer=s.norms_per_layer * h, dense_mlp=dense_mlp, expert=expert,
        router=router, shared=shared, embedding=s.vocab * h, lm_head=0 if s.tied else s.vocab * h,
        final_norm=h, vision=s.vision_params, num_dense_layers=s.num_layers - n_moe, num_moe_layers=n_moe,
        experts=s.num_experts if n_moe else 0, top_k=s.experts_per_token if n_moe else 0,
        attn_all=attn_all, extra=s.extra_params,
        dense_mlp_layers=s.num_layers if s.dense_mlp_in_moe_layers else -1,
    )


def weight_bytes(s: ArchSpec, dtype: str) -> float:
    """Bytes of all weights with the decoder's linear layers in ``dtype`` (see module docstring)."""
    c = count_params(s)
    if dtype == "bf16":
        return 2.0 * c.total
    decoder = c.total - c.non_decoder
    return 2.0 * c.non_decoder + decoder * (DTYPE_BYTES[dtype] + SCALE_BYTES[dtype])


def kv_bytes_per_token(s: ArchSpec, dtype: str) -> float:
    """KV-cache bytes one token occupies over all layers (MLA caches the latent + RoPE key)."""
    per_elem = DTYPE_BYTES[dtype]
    if s.kv_elems_per_token:  # compressed / hybrid caches (profiler/arch_families.py)
        return s.kv_elems_per_token * per_elem
    if s.is_mla:
        return s.num_layers * (s.kv_lora_rank + s.qk_rope_head_dim) * per_elem
    return 2.0 * s.num_layers * s.num_kv_heads * s.head_dim * per_elem


def kv_state_bytes(s: ArchSpec, dtype: str) -> float:
    """Per-request cache state that does not grow with the context (linear-attention state, DeepSeek-V4's window)."""
    return s.state_elems * DTYPE_BYTES[dtype]


def attn_flops_per_ctx(s: ArchSpec, phase: str) -> float:
    """Attention FLOPs per token per context token, summed over layers (before windowing)."""
    if s.attn_ctx_flops:  # layer-by-layer architectures: summed by profiler/arch_families.py (decode form)
        return s.attn_ctx_flops
    if s.is_mla:
        if phase == "decode":  # absorbed: scores over latent+rope, values from the latent
            per_head = (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank
        else:
            per_head = (s.qk_nope_head_dim + s.qk_rope_head_dim) + s.v_head_dim
        return 2.0 * s.num_heads * per_head * s.num_layers
    return 2.0 * 2.0 * s.num_heads * s.head_dim * s.num_layers


def effective_context(s: ArchSpec, ctx: float) -> float:
    """Context averaged over layers: sliding-window layers see at most their window."""
    if not s.sliding_window or not s.sliding_layers:
        return ctx
    full = s.num_layers - s.sliding_layers
    return (full * ctx + s.sliding_layers * min(ctx, s.sliding_window)) / s.num_layers


def flops_per_token(s: ArchSpec, ctx: float, phase: str = "decode") -> float:
    """FLOPs for one token that attends over ``ctx`` context tokens."""
    return 2.0 * count_params(s).linear_active + attn_flops_per_ctx(s, phase) * effective_context(s, ctx)


def prefill_flops_per_token(s: ArchSpec, prompt_len: float) -> float:
    """Mean FLOPs per prompt token: causal attention sees (P + 1) / 2 tokens on average."""
    return flops_per_token(s, (prompt_len + 1.0) / 2.0, "prefill")


def weights_touched_bytes(s: ArchSpec, batch: float, dtype: str = "bf16") -> float:
    """Weight bytes one decode step reads at ``batch`` tokens: MoE layers read only the experts hit.

    With uniform routing, a batch of B tokens choosing k of E experts hits E * (1 - (1 - k/E)^B)
    distinct experts per layer.
    """
    c = count_params(s)
    per = DTYPE_BYTES[dtype] + SCALE_BYTES[dtype]
    non_decoder = 2.0 * (c.embedding + c.lm_head + c.final_norm)  # bf16; the vision tower is not read
    routed = c.num_moe_layers * c.experts * c.expert
    dense_decoder = c.total - c.non_decoder - routed
    hit = c.experts * (1.0 - (1.0 - c.top_k / c.experts) ** max(batch, 1.0)) if c.experts else 0.0
    return non_decoder + dense_decoder * per + c.num_moe_layers * hit * c.expert * per


def decode_step(s: ArchSpec, batch: float, ctx: float, dtype: str = "bf16", kv_dtype: str = "bf16",
                ) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step: ``batch`` tokens, each attending over ``ctx`` tokens."""
    flops = batch * flops_per_token(s, ctx, "decode")
    kv = batch * effective_context(s, ctx) * kv_bytes_per_token(s, kv_dtype)
    return flops, weights_touched_bytes(s, batch, dtype) + kv


def arithmetic_intensity(s: ArchSpec, batch: float, ctx: float, dtype: str = "bf16") -> float:
    """FLOPs per byte of one decode step at ``batch`` (the roofline's x axis)."""
    flops, nbytes = decode_step(s, batch, ctx, dtype)
    return flops / nbytes
