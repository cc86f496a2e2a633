"""The decode / verify step through `torch.compile` (gpt-fast's recipe): one graph per shape bucket.

Eager PyTorch walks ~15 ops per layer from Python each step; compiled, a step is one inductor graph (C++/OpenMP
on a CPU, Triton on a GPU) whose pointwise work (norms, RoPE, SiLU, casts) is fused around the GEMMs.

* Shapes come in buckets so a step never retraces: rows B padded to a power of two (padding repeats the last real
  row, whose KV writes are then identical to its own), tokens per row T padded to a power of two up to
  `MAX_T` (padding writes past a row's length, which the next real tokens overwrite before anyone reads them,
  as in the eager model), and the keys read per slot Lk to a power of two from `MIN_LK` (attention masks past
  each row's position). The KV cache is addressed by tensors (slots, positions), never by Python ints.
* Only steps of up to `MAX_T` tokens per row go through it (decode and verify); prefill stays eager.
* The eager model is the reference: in fp32 a compiled step's greedy tokens equal eager's (tested).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dspark_core.modeling.model import ForwardOut, KVCache, LeanModel, apply_rope

MAX_T = 16  # tokens per row a compiled step takes (verify blocks); longer steps (prefill) run eager
MIN_LK = 128  # the smallest key bucket


def bucket(n: int, floor: int = 1) -> int:
    """The next power of two >= max(n, floor)."""
    return 1 << (max(n, floor) - 1).bit_length()


def _core(model: LeanModel, tokens: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
          ks: list[torch.Tensor], vs: list[torch.Tensor], lk: int, hidden_layers: tuple[int, ...]
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, pos [B, T] long; slots [B] long -> logits [B, T, V] float32, hidden [B, T, W] or None.

    Writes each row's K/V at (slot, pos) and attends over the slot's first `lk` positions, masked past pos."""
    b, t = tokens.shape
    freqs = pos.float()[..., None] * model.inv_freq  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    cos, sin = emb.cos().to(model.dtype), emb.sin().to(model.dtype)  # [B, T, 1, hd]
    mask = (torch.arange(lk, device=pos.device)[None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, T, Lk]
    rows = slots[:, None].expand(b, t)
    x = model.embed(tokens)  # [B, T, H]
    caught = []
    for i, layer in enumerate(model.layers):
        h = layer.input_norm(x)
        q, k, v = layer.qkv(h).split([layer.nh * layer.hd, layer.nkv * layer.hd, layer.nkv * layer.hd], dim=-1)
        q, k, v = (q.view(b, t, layer.nh, layer.hd), k.view(b, t, layer.nkv, layer.hd),
                   v.view(b, t, layer.nkv, layer.hd))
        if layer.q_norm is not None and layer.k_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ks[i].index_put_((rows, pos), k.to(ks[i].dtype))
        vs[i].index_put_((rows, pos), v.to(vs[i].dtype))
        keys = ks[i][slots, :lk].to(q.dtype).transpose(1, 2)  # [B, nkv, Lk, hd]
        vals = vs[i][slots, :lk].to(q.dtype).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask,
                                              enable_gqa=layer.nkv != layer.nh)
        x = x + layer.o(attn.transpose(1, 2).reshape(b, t, layer.nh * layer.hd))
        gate, up = layer.gate_up(layer.post_norm(x)).chunk(2, dim=-1)
        x = x + layer.down(F.silu(gate) * up)
        if i in hidden_layers:
            caught.append(x)
    hidden = torch.cat(caught, dim=-1) if caught else None
    return model.lm_head(model.norm(x)).float(), hidden


@dataclass
class CompiledStep:
    """`model`'s decode / verify forward through torch.compile, with the buckets it has compiled and what it took."""

    model: LeanModel
    fn: object = None  # the compiled _core
    seen: dict[tuple, float] = field(default_factory=dict)  # (B, T, Lk, hidden layers) -> seconds its first call took

    def __post_init__(self) -> None:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        self.fn = torch.compile(_core, dynamic=False)

    @staticmethod
    def takes(t: int, cache: KVCache, slots: list[int]) -> bool:
        """Whether a step of `t` tokens per row goes through the compiled graph: a decode / verify step whose
        padded tokens still fit every slot."""
        return t <= MAX_T and int(cache.lens[slots].max()) + bucket(t) <= cache.max_len

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, cache: KVCache, slots: list[int], n_new: list[int],
                 hidden_layers: tuple[int, ...]) -> ForwardOut:
        """As LeanModel.forward for a step `takes` accepts: dense [B, T, ...] outputs (rows past n_new hold
        padding), the cache lengths advanced by n_new."""
        b, t = tokens.shape
        bb, tb = bucket(b), bucket(t)
        starts = cache.lens[slots]  # [B]
        lk = min(bucket(int(starts.max()) + tb, MIN_LK), cache.max_len)
        dev = self.model.device
        tok = torch.zeros(bb, tb, dtype=torch.long)
        tok[:b, :t] = tokens
        pos = starts[:, None] + torch.arange(tb)[None, :]  # [B, Tb]
        idx = torch.tensor(slots + [slots[-1]] * (bb - b), dtype=torch.long)
        if bb > b:  # padded rows repeat the last real row: identical writes
            tok[b:] = tok[b - 1]
            pos = torch.cat([pos, pos[-1:].expand(bb - b, tb)])
        key = (bb, tb, lk, hidden_layers)
        t0 = time.perf_counter()
        logits, hidden = self.fn(self.model, tok.to(dev), pos.to(dev), idx.to(dev), cache.k, cache.v, lk,
                                 hidden_layers)
        if key not in self.seen:
            self.seen[key] = time.perf_counter() - t0
        for r, s in enumerate(slots):
            cache.lens[s] = int(starts[r]) + n_new[r]
        return ForwardOut(flat_logits=logits[:b, :t], flat_hidden=None if hidden is None else hidden[:b, :t])
