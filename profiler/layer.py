"""One decoder layer of an ArchSpec's structure at a small width, for the ONNX operator census.

Written plainly (the way the reference implementations compute it: RMSNorm as x * rsqrt(mean(x^2)),
rotate_half RoPE, repeat_kv GQA, softmax attention, gated MLP, top-k routed experts) so the
exported graph shows the same patterns a serving engine fuses. Sizes are tiny; weights are
random (seeded); only the structure matters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from profiler.arch import ArchSpec

# small export sizes: the census counts structure, so the width is irrelevant
HIDDEN, HEAD_DIM, INTER, SEQ = 64, 16, 96, 8
EXPERTS, TOP_K = 4, 2  # routed experts in the export (top-k kept <= EXPERTS)
Q_LORA, KV_LORA, NOPE, ROPE, V_DIM = 32, 32, 16, 8, 16  # MLA export sizes


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin  # x: [B, H, T, D]; cos/sin: [T, D]


class Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, inter, bias=bias)
        self.up = nn.Linear(hidden, inter, bias=bias)
        self.down = nn.Linear(inter, hidden, bias=bias)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x)
        a = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh")
        return self.down(a * self.up(x))


class Moe(nn.Module):
    """Router -> top-k -> grouped experts (one batched GEMM per projection, as fused MoE kernels run)."""

    def __init__(self, s: ArchSpec, hidden: int) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, EXPERTS, bias=False)
        self.w_gate = nn.Parameter(torch.randn(EXPERTS, hidden, INTER) * 0.02)  # [E, H, I]
        self.w_up = nn.Parameter(torch.randn(EXPERTS, hidden, INTER) * 0.02)  # [E, H, I]
        self.w_down = nn.Parameter(torch.randn(EXPERTS, INTER, hidden) * 0.02)  # [E, I, H]
        self.act = s.act
        self.shared = Mlp(hidden, INTER, s.act, False) if s.shared_intermediate else None
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if s.shared_expert_gate else None
        self.sigmoid_scores = s.family.startswith("deepseek")
        self.top_k = min(TOP_K, s.experts_per_token)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)  # [B, T, E]
        scores = logits.sigmoid() if self.sigmoid_scores else logits.softmax(-1)
        top_v, top_i = scores.topk(self.top_k, dim=-1)  # [B, T, k]
        weights = torch.zeros_like(scores).scatter(-1, top_i, top_v)  # [B, T, E]
        xe = x.unsqueeze(1)  # [B, 1, T, H]
        g = xe @ self.w_gate  # [B, E, T, I]
        a = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh")
        y = (a * (xe @ self.w_up)) @ self.w_down  # [B, E, T, H]
        out = (weights.transpose(1, 2).unsqueeze(-1) * y).sum(1)  # [B, T, H]
        if self.shared is not None:
            sh = self.shared(x)
            if self.shared_gate is not None:
                sh = torch.sigmoid(self.shared_gate(x)) * sh
            out = out + sh
        return out


class Attention(nn.Module):
    def __init__(self, s: ArchSpec, hidden: int) -> None:
        super().__init__()
        self.heads = max(2, hidden // HEAD_DIM)
        ratio = max(1, s.num_heads // max(1, s.num_kv_heads))
        self.kv_heads = 1 if s.num_kv_heads == 1 else max(1, self.heads // min(ratio, self.heads))
        self.q = nn.Linear(hidden, self.heads * HEAD_DIM, bias=s.qkv_bias)
        self.k = nn.Linear(hidden, self.kv_heads * HEAD_DIM, bias=s.qkv_bias)
        self.v = nn.Linear(hidden, self.kv_heads * HEAD_DIM, bias=s.qkv_bias)
        self.o = nn.Linear(self.heads * HEAD_DIM, hidden, bias=s.o_bias)
        self.q_norm = RMSNorm(HEAD_DIM) if s.qk_norm else None
        self.k_norm = RMSNorm(HEAD_DIM) if s.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, HEAD_DIM)  # [B, T, H, D]
        k = self.k(x).view(b, t, self.kv_heads, HEAD_DIM)  # [B, T, Hkv, D]
        v = self.v(x).view(b, t, self.kv_heads, HEAD_DIM)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.heads // self.kv_heads
        if rep > 1:  # repeat_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + mask  # [B, H, T, T]
        out = scores.softmax(-1) @ v  # [B, H, T, D]
        return self.o(out.transpose(1, 2).reshape(b, t, self.heads * HEAD_DIM))


class MlaAttention(nn.Module):
    """DeepSeek multi-head latent attention, expanded form."""

    def __init__(self, s: ArchSpec, hidden: int) -> None:
        super().__init__()
        self.heads = max(2, hidden // HEAD_DIM)
        if s.q_lora_rank:
            self.q_a = nn.Linear(hidden, Q_LORA, bias=False)
            self.q_a_norm = RMSNorm(Q_LORA)
            self.q_b = nn.Linear(Q_LORA, self.heads * (NOPE + ROPE), bias=False)
        else:
            self.q_a = None
            self.q_b = nn.Linear(hidden, self.heads * (NOPE + ROPE), bias=False)
        self.kv_a = nn.Linear(hidden, KV_LORA + ROPE, bias=False)
        self.kv_a_norm = RMSNorm(KV_LORA)
        self.kv_b = nn.Linear(KV_LORA, self.heads * (NOPE + V_DIM), bias=False)
        self.o = nn.Linear(self.heads * V_DIM, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_b(self.q_a_norm(self.q_a(x))) if self.q_a is not None else self.q_b(x)
        q = q.view(b, t, self.heads, NOPE + ROPE).transpose(1, 2)  # [B, H, T, NOPE+ROPE]
        q_nope, q_rope = q[..., :NOPE], q[..., NOPE:]
        kv = self.kv_a(x)  # [B, T, KV_LORA+ROPE]
        latent, k_rope = kv[..., :KV_LORA], kv[..., KV_LORA:]
        kv = self.kv_b(self.kv_a_norm(latent)).view(b, t, self.heads, NOPE + V_DIM).transpose(1, 2)
        k_nope, v = kv[..., :NOPE], kv[..., NOPE:]
        k_rope = apply_rope(k_rope.unsqueeze(1), cos, sin).expand(b, self.heads, t, ROPE)
        q = torch.cat([q_nope, apply_rope(q_rope, cos, sin)], dim=-1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(NOPE + ROPE) + mask  # [B, H, T, T]
        out = scores.softmax(-1) @ v  # [B, H, T, V]
        return self.o(out.transpose(1, 2).reshape(b, t, self.heads * V_DIM))


class DecoderLayer(nn.Module):
    def __init__(self, s: ArchSpec) -> None:
        super().__init__()
        self.input_norm = RMSNorm(HIDDEN)
        self.attn = MlaAttention(s, HIDDEN) if s.is_mla else Attention(s, HIDDEN)
        self.sandwich = s.norms_per_layer == 4  # Gemma-2/3: norms after attention and MLP too
        self.post_attn_norm = RMSNorm(HIDDEN)
        self.pre_mlp_norm = RMSNorm(HIDDEN) if self.sandwich else None
        self.post_mlp_norm = RMSNorm(HIDDEN) if self.sandwich else None
        self.mlp: nn.Module = Moe(s, HIDDEN) if s.is_moe else Mlp(HIDDEN, INTER, s.act, s.mlp_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.input_norm(x), cos, sin, mask)
        if self.sandwich and self.pre_mlp_norm is not None and self.post_mlp_norm is not None:
            h = x + self.post_attn_norm(a)
            return h + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(h)))
        h = x + a
        return h + self.mlp(self.post_attn_norm(h))


def build_layer(s: ArchSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The layer (eval mode, seeded weights) and example inputs (x, cos, sin, causal mask)."""
    torch.manual_seed(0)
    layer = DecoderLayer(s).eval()
    rot = ROPE if s.is_mla else HEAD_DIM
    pos = torch.arange(SEQ, dtype=torch.float32)[:, None]  # [T, 1]
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))  # [rot/2]
    ang = torch.cat([pos * inv, pos * inv], dim=-1)  # [T, rot]
    mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)  # [T, T]
    x = torch.randn(1, SEQ, HIDDEN)  # [B, T, HIDDEN]
    return layer, (x, ang.cos(), ang.sin(), mask)
