"""The lean target runner: a gpt-fast-style decoder forward over a preallocated, slot-indexed KV cache.

* One module for Qwen3 / Qwen2 / Llama / Mistral (they differ by q/k-norm, qkv bias and RoPE scaling).
* `forward(tokens [B, T], cache, slots, n_new)`: B requests, each appending up to T tokens at its own
  position (rows padded to T). Returns logits of every new position and, optionally, the hidden states of
  chosen decoder layers (the DSpark drafter conditions on them).
* Ragged batches (rows with different n_new, as SGLang verifies them): every token-wise op (embedding,
  norms, qkv / o / gate-up / down projections, LM head) runs on the N = sum(n_new) real tokens packed as
  [N, H]; only attention goes through the padded [B, T] layout (packed queries scattered in, outputs
  gathered back), and only real tokens are written to the KV cache. A verify batch then costs
  sum(n_new) tokens of compute, not B * max(n_new), so trimming one request's verify length pays.
* KV cache: one preallocated tensor pair per layer `[slots, max_len, kv_heads, head_dim]` and one length per
  slot. Rolling back rejected tokens is `cache.truncate(slot, n)`: O(1), nothing is copied or freed.
  Padded rows and rejected tokens leave garbage past the length that the next real tokens overwrite before
  any query can see it (a query at position p only attends keys <= p, all written by then).
* `forward_full(tokens [B, T])`: plain causal forward without a cache (training, reference checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark_core.kernels.rmsnorm import rmsnorm as rmsnorm_kernel
from dspark_core.kernels.spec import use_triton
from dspark_core.kernels.swiglu import swiglu as swiglu_kernel
from dspark_core.modeling import cpu_attention
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.argmax import top1


class RMSNorm(nn.Module):
    """y = x / rms(x) * w, computed in fp32 like the reference implementations."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):  # CUDA (or forced): the fused Triton kernel, tuned config per shape bucket
            return rmsnorm_kernel(x, self.weight, self.eps)[0]
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(arch: ArchConfig) -> torch.Tensor:
    """[head_dim / 2] inverse frequencies, with llama3-style scaling when the checkpoint asks for it."""
    d = arch.head_dim
    inv = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = arch.rope_scaling
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        factor, low, high = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(is_medium, smoothed, scaled)
    elif sc and sc.get("rope_type", sc.get("type")) == "linear":
        inv = inv / float(sc["factor"])
    return inv


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, hd] rotated by cos/sin [B, T, 1, hd] (rotate-half convention)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def prefix_lens(pos: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """pos [B, T] -> [B, T] the keys each query attends (its position + 1: `attend`'s `lens`). With `packed` ([N]
    flat grid positions of a ragged step's real tokens) the grid's padding queries get 0, which our kernel skips
    (an 8-row verify of 13 real tokens on a 9-wide grid otherwise ran 72 queries' attention)."""
    lens = pos + 1
    if packed is None:
        return lens
    live = torch.zeros(lens.numel(), dtype=lens.dtype, device=lens.device).index_fill(0, packed, 1)
    return lens * live.view_as(lens)


def attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor | None,
           lens: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, nh, T, hd] over keys / vals [B, nkv, Lk, hd], mask [B, 1, T, Lk] (True = attend) or None -> [B, nh, T, hd].
    `lens` [B, T]: the mask is a prefix, query (b, t) attending its row's first lens[b, t] keys (a decode / verify
    step over the cache; 0 marks a ragged step's padding query, whose output is dropped); in bf16 on an
    AVX512-BF16 CPU our kernel runs it (modeling/cpu_attention.py).

    Grouped-query attention by folding each KV head's g = nh / nkv query heads into the query length ([B, nkv,
    g * T, hd], query head h = kv head h // g, as `enable_gqa` maps them): SDPA's CPU kernel with `enable_gqa` costs
    7x this in bf16 at 8 requests x 1 token and 5x at one (0.26 vs 0.05 ms a layer, SmolLM2-135M; issue 41)."""
    if lens is not None and cpu_attention.takes(q, keys):
        return torch.ops.dspark.cpu_attention(q, keys, vals, lens)
    b, nh, t, hd = q.shape
    g = nh // keys.shape[1]
    if g == 1:
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
    m = None if mask is None else mask.repeat(1, 1, g, 1)  # rows in (query head within group, t) order
    out = F.scaled_dot_product_attention(q.reshape(b, keys.shape[1], g * t, hd), keys, vals, attn_mask=m)
    return out.reshape(b, nh, t, hd)


@dataclass
class KVCache:
    """Preallocated per-layer K/V for `slots` requests of up to `max_len` positions each."""

    k: list[torch.Tensor]  # per layer [slots, max_len, kv_heads, head_dim]
    v: list[torch.Tensor]  # per layer [slots, max_len, kv_heads, head_dim]
    lens: torch.Tensor  # [slots] long (CPU): committed positions per slot

    @property
    def max_len(self) -> int:
        """Positions per slot (including the margin for a padded block)."""
        return self.k[0].shape[1]

    def truncate(self, slot: int, length: int) -> None:
        """O(1) rollback: keep the first `length` positions of `slot`."""
        self.lens[slot] = length

    def length(self, slot: int) -> int:
        """Committed positions of `slot`."""
        return int(self.lens[slot])


@dataclass
class Packing:
    """Where the N real tokens of a ragged batch sit in the padded [B, T] grid (row-major)."""

    b: int  # rows (requests)
    t: int  # padded row length (longest n_new)
    index: torch.Tensor  # [N] long: flat position r * T + j of each real token, in row order
    lens: list[int]  # [B] real tokens per row (n_new)

    @classmethod
    def of(cls, n_new: list[int], t: int, device: torch.device) -> Packing:
        """The packing of rows with n_new[r] real tokens each, padded to t."""
        index = torch.tensor([r * t + j for r, n in enumerate(n_new) for j in range(n)], dtype=torch.long)
        return cls(b=len(n_new), t=t, index=index.to(device), lens=list(n_new))

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        """[N, D] packed rows -> [B, T, D] with zeros at the padding."""
        out = packed.new_zeros(self.b * self.t, packed.shape[-1]).index_copy_(0, self.index, packed)
        return out.view(self.b, self.t, -1)

    def last(self) -> torch.Tensor:
        """[B] long: packed index of each row's last real token."""
        ends = torch.tensor(self.lens, dtype=torch.long).cumsum(0) - 1
        return ends.to(self.index.device)


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP with fused qkv and gate/up projections."""

    def __init__(self, a: ArchConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.input_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.qkv = nn.Linear(a.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=a.attention_bias)
        self.o = nn.Linear(self.nh * self.hd, a.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, a.rms_norm_eps) if a.qk_norm else None
        self.k_norm = RMSNorm(self.hd, a.rms_norm_eps) if a.qk_norm else None
        self.post_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.gate_up = nn.Linear(a.hidden_size, 2 * a.intermediate_size, bias=False)
        self.down = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H], or [N, H] packed real tokens when `pack` is given
        cos: torch.Tensor,  # [B, T, 1, hd] (packed: [N, 1, hd])
        sin: torch.Tensor,  # [B, T, 1, hd] (packed: [N, 1, hd])
        kv: tuple[torch.Tensor, torch.Tensor] | None,  # cache tensors of this layer
        write: tuple[torch.Tensor, torch.Tensor] | None,  # (slot index, positions), each [B, T] (packed: [N])
        read: tuple[torch.Tensor | int | tuple[int, int], int] | None,  # (slots [B] / one slot / range, Lk)
        mask: torch.Tensor | None,  # [B, 1, T, Lk] bool (True = attend) or None = causal over T
        pack: Packing | None = None,  # where the packed tokens sit in the padded [B, T] grid
        lens: torch.Tensor | None = None,  # [B, T] keys each query attends (the mask as prefix lengths)
    ) -> torch.Tensor:
        lead = x.shape[:-1]  # (B, T) or (N,)
        h = self.input_norm(x)
        q, k, v = self.qkv(h).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(*lead, self.nh, self.hd)
        k = k.view(*lead, self.nkv, self.hd)
        v = v.view(*lead, self.nkv, self.hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None and write is not None and read is not None:
            kc, vc = kv
            kc[write] = k.to(kc.dtype)  # scatter the new keys at each request's positions
            vc[write] = v.to(vc.dtype)
            slots, lk = read
            if isinstance(slots, tuple):  # consecutive slots (s0, s1): a view, nothing copied
                keys, vals = kc[slots[0] : slots[1], :lk], vc[slots[0] : slots[1], :lk]
            else:
                keys, vals = kc[slots, :lk], vc[slots, :lk]  # [B, Lk, nkv, hd] (a view when one int slot)
            if isinstance(slots, int):
                keys, vals = keys.unsqueeze(0), vals.unsqueeze(0)
            keys, vals = keys.to(q.dtype).transpose(1, 2), vals.to(q.dtype).transpose(1, 2)  # [B, nkv, Lk, hd]
            if pack is not None:  # packed queries -> padded [B, T, nh, hd] (pad rows are zeros, discarded)
                q = q.new_zeros(pack.b * pack.t, self.nh, self.hd).index_copy_(0, pack.index, q)
                q = q.view(pack.b, pack.t, self.nh, self.hd)
            attn = attend(q.transpose(1, 2), keys, vals, mask, lens)
        else:
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                enable_gqa=self.nkv != self.nh,
            )
        attn = attn.transpose(1, 2)  # [B, T, nh, hd]
        if pack is not None:
            attn = attn.reshape(pack.b * pack.t, self.nh * self.hd).index_select(0, pack.index)  # [N, nh*hd]
        else:
            attn = attn.reshape(*lead, self.nh * self.hd)
        x = x + self.o(attn)
        gate, up = self.gate_up(self.post_norm(x)).chunk(2, dim=-1)
        act = swiglu_kernel(gate, up) if use_triton(gate) else F.silu(gate) * up
        return x + self.down(act)


@dataclass
class ForwardOut:
    """Result of a cached forward.

    A dense batch (every row full) keeps the [B, T, ...] layout. A ragged batch keeps its real tokens packed
    ([N, ...], `pack` says where): `row_logits` / `row_hidden` / `argmax` read them without padding, and the
    `logits` / `hidden` properties pad to [B, T, ...] (zeros at the padding) for callers that want a grid.
    """

    flat_logits: torch.Tensor  # float32: [B, T, V], [B, 1, V] with last_only, or [N, V] packed
    flat_hidden: torch.Tensor | None  # [B, T, W] or [N, W] packed; W = len(hidden_layers) * H
    pack: Packing | None = None  # set for a ragged batch (hidden packed; logits too unless last_only)
    last_only: bool = False  # logits hold only each row's last real token

    @property
    def logits(self) -> torch.Tensor:
        """[B, T, V] (or [B, 1, V] with last_only) float32."""
        return self.pack.pad(self.flat_logits) if self.pack is not None and not self.last_only else self.flat_logits

    @property
    def hidden(self) -> torch.Tensor | None:
        """[B, T, W] hidden states of the chosen layers (None when none were asked for)."""
        if self.flat_hidden is None or self.pack is None:
            return self.flat_hidden
        return self.pack.pad(self.flat_hidden)

    def _row(self, x: torch.Tensor, r: int, packed: bool) -> torch.Tensor:
        if not packed or self.pack is None:
            return x[r]
        start = sum(self.pack.lens[:r])
        return x[start : start + self.pack.lens[r]]

    def row_logits(self, r: int) -> torch.Tensor:
        """Row r's logits: [n_new[r], V] ([T, V] for a dense batch, [1, V] with last_only)."""
        return self._row(self.flat_logits, r, not self.last_only)

    def row_hidden(self, r: int) -> torch.Tensor:
        """Row r's hidden states: [n_new[r], W] ([T, W] for a dense batch)."""
        if self.flat_hidden is None:
            raise ValueError("no hidden states: pass hidden_layers to the forward")
        return self._row(self.flat_hidden, r, True)

    def argmax(self) -> torch.Tensor:
        """[B, T] long: the greedy token at every position (0 at the padding); one argmax over real tokens."""
        if self.pack is None or self.last_only:
            return top1(self.flat_logits)
        best = top1(self.flat_logits)  # [N]
        out = best.new_zeros(self.pack.b * self.pack.t).index_copy_(0, self.pack.index, best)
        return out.view(self.pack.b, self.pack.t)


class LeanModel(nn.Module):
    """A Qwen3 / Qwen2 / Llama / Mistral decoder; build with `load_model` or `LeanModel(arch)`."""

    def __init__(self, arch: ArchConfig) -> None:
        super().__init__()
        self.arch = arch
        self.embed = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(arch), persistent=False)
        self.compiled = None  # a CompiledStep (modeling/compiled.py): decode / verify steps, fresh prefills

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """Weight dtype."""
        return self.embed.weight.dtype

    def new_cache(self, slots: int, max_len: int, dtype: torch.dtype | None = None, margin: int = 32) -> KVCache:
        """Allocate a KV cache for `slots` requests of `max_len` positions (+ `margin` for padded blocks)."""
        a = self.arch
        shape = (slots, max_len + margin, a.num_key_value_heads, a.head_dim)
        dt = dtype or self.dtype
        k = [torch.zeros(shape, dtype=dt, device=self.device) for _ in range(a.num_hidden_layers)]
        v = [torch.zeros(shape, dtype=dt, device=self.device) for _ in range(a.num_hidden_layers)]
        return KVCache(k=k, v=v, lens=torch.zeros(slots, dtype=torch.long))

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos [B, T] -> cos, sin [B, T, 1, hd] in the activation dtype."""
        freqs = pos.to(self.inv_freq.device).float()[..., None] * self.inv_freq  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _collect(self, x: torch.Tensor, i: int, layers: tuple[int, ...], out: dict[int, torch.Tensor]) -> None:
        if i in layers:
            out[i] = x

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] long, rows padded past n_new[b]
        cache: KVCache,
        slots: list[int],  # [B] cache slot of each row
        n_new: list[int] | None = None,  # [B] real tokens per row (default: all T)
        hidden_layers: tuple[int, ...] = (),  # decoder layers whose outputs to return (concatenated)
        last_only: bool = False,  # return only the logits of each row's last real token
    ) -> ForwardOut:
        """Append each row's tokens to its slot, attend to the slot's history, return logits (+ hidden)."""
        b, t = tokens.shape
        n_new = n_new if n_new is not None else [t] * b
        if self.compiled is not None and not last_only and self.compiled.takes(t, cache, slots, hidden_layers):
            return self.compiled(tokens, cache, slots, n_new, hidden_layers)
        if self.compiled is not None and last_only and self.compiled.takes_prefill(tokens, cache, slots, n_new,
                                                                                   hidden_layers):
            return self.compiled.prefill(tokens, cache, slots, n_new, hidden_layers)
        starts = cache.lens[slots]  # [B] long (CPU)
        pos = starts[:, None] + torch.arange(t)[None, :]  # [B, T]
        lk = int(starts.max()) + t
        if lk > cache.max_len:
            raise ValueError(f"KV cache overflow: {lk} positions > {cache.max_len}; raise model.max_seq_len")
        dev = self.device
        pos_d = pos.to(dev)
        slot_t = torch.tensor(slots, device=dev)
        consecutive = slots == list(range(slots[0], slots[0] + b))  # rows are slots s0.. in order: read a view
        read: tuple[torch.Tensor | int | tuple[int, int], int] = (
            slots[0] if b == 1 else (slots[0], slots[0] + b) if consecutive else slot_t, lk)
        mask = None
        if t > 1 or b > 1:
            mask = (torch.arange(lk, device=dev)[None, None, :] <= pos_d[:, :, None])[:, None]  # [B, 1, T, Lk]
        pack = Packing.of(n_new, t, dev) if b > 1 and min(n_new) < t else None  # ragged: pack real tokens
        if pack is None:
            write = (slot_t[:, None].expand(b, t), pos_d)
            cos, sin = self._rope(pos_d)  # [B, T, 1, hd]
            x = self.embed(tokens.to(dev))  # [B, T, H]
        else:
            write = (slot_t[:, None].expand(b, t).reshape(-1)[pack.index], pos_d.reshape(-1)[pack.index])  # [N]
            cos, sin = (c[0] for c in self._rope(pos_d.reshape(-1)[pack.index][None]))  # [N, 1, hd]
            x = self.embed(tokens.reshape(-1).to(dev)[pack.index])  # [N, H]
        caught: dict[int, torch.Tensor] = {}
        lens = prefix_lens(pos_d, pack.index if pack is not None else None)  # [B, T] keys each query attends
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, (cache.k[i], cache.v[i]), write, read, mask, pack, lens)
            self._collect(x, i, hidden_layers, caught)
        for r, s in enumerate(slots):
            cache.lens[s] = int(starts[r]) + n_new[r]
        hidden = torch.cat([caught[i] for i in hidden_layers], dim=-1) if hidden_layers else None
        if last_only:
            idx = pack.last() if pack is not None else (
                torch.arange(b, device=dev) * t + torch.tensor([n - 1 for n in n_new], device=dev))
            x = x.reshape(-1, x.shape[-1])[idx][:, None]  # [B, 1, H]
        logits = self.lm_head(self.norm(x)).float()
        return ForwardOut(flat_logits=logits, flat_hidden=hidden, pack=pack, last_only=last_only)

    def forward_full(
        self, tokens: torch.Tensor, hidden_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal forward without a cache (differentiable): tokens [B, T] -> logits [B, T, V], hidden."""
        b, t = tokens.shape
        pos = torch.arange(t, device=self.device)[None].expand(b, t)
        cos, sin = self._rope(pos)
        x = self.embed(tokens)
        caught: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None, None, None, None)
            self._collect(x, i, hidden_layers, caught)
        hidden = torch.cat([caught[i] for i in hidden_layers], dim=-1) if hidden_layers else None
        return self.lm_head(self.norm(x)), hidden
