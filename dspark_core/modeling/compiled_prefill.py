"""A prefill through `torch.compile`: the prompts of requests admitted together, in one graph.

A serving engine admits requests as slots free, one or two at a time, and each admission's prefill stalls the batch:
eager, SmolLM2-135M bf16 on two AVX512 (AMX) cores, a 40-token prompt took 36 ms where its GEMMs took 18 (the rest is
~15 ops a layer launched from Python), and at 8 requests on 64 chat prompts the admissions cost the speculative
methods ~7% of the run against plain's, whose requests all finish (and are admitted) together (RESULTS.md, issue 42).

The graph takes the real tokens packed ([N], a dynamic size) with rows starting at position 0 (fresh slots: the
engine truncates a slot before admitting into it), writes their K/V into the cache at (slot, position), and attends
causally over the step's own keys on the [B, T] grid (T = the longest prompt, dynamic), so it never reads the cache.
Only each row's last token goes through the final norm and the LM head (`last_only`). Rows B are a static size (a
graph for one row, another for B >= 2 with B dynamic). Anything else (a row with earlier context, a one-token
prompt, CUDA graphs) runs the eager model, the reference: in fp32 the compiled prefill's logits equal eager's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dspark_core.modeling.model import DecoderLayer, KVCache, LeanModel, Packing, apply_rope


def on_grid(z: torch.Tensor, packed: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """[N, heads, hd] packed -> [B, heads, T, hd] on the grid, zeros at the padding."""
    n, heads, hd = z.shape
    return z.new_zeros(b * t, heads, hd).index_copy(0, packed, z).view(b, t, heads, hd).transpose(1, 2)


def packed_rope(model: LeanModel, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pos [N] long -> cos, sin [N, 1, hd] in the weights' dtype."""
    freqs = pos.float()[:, None] * model.inv_freq  # [N, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos().to(model.dtype), emb.sin().to(model.dtype)


def packed_qkv(layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, H] packed tokens -> q [N, nh, hd], k, v [N, nkv, hd] (normed, rotated); K/V written at (rows, pos)."""
    nh, nkv, hd = layer.nh, layer.nkv, layer.hd
    q, k, v = layer.qkv(layer.input_norm(x)).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q, k, v = q.view(-1, nh, hd), k.view(-1, nkv, hd), v.view(-1, nkv, hd)
    if layer.q_norm is not None and layer.k_norm is not None:
        q, k = layer.q_norm(q), layer.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache.index_put_((rows, pos), k.to(k_cache.dtype))
    v_cache.index_put_((rows, pos), v.to(v_cache.dtype))
    return q, k, v


def causal_own(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: torch.Tensor, b: int, t: int
               ) -> torch.Tensor:
    """Prompts' attention over their own keys: q [N, nh, hd], k, v [N, nkv, hd] packed, placed on the [B, T] grid by
    `packed`, causal -> [N, nh * hd]."""
    nh, nkv, hd = q.shape[1], k.shape[1], q.shape[2]
    kg, vg = on_grid(k.to(q.dtype), packed, b, t), on_grid(v.to(q.dtype), packed, b, t)
    if nh != nkv:  # each KV head serves nh / nkv query heads (as enable_gqa maps them)
        kg, vg = kg.repeat_interleave(nh // nkv, dim=1), vg.repeat_interleave(nh // nkv, dim=1)
    attn = F.scaled_dot_product_attention(on_grid(q, packed, b, t), kg, vg, is_causal=True)  # [B, nh, T, hd]
    return attn.transpose(1, 2).reshape(b * t, nh * hd)[packed]


def mlp(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's SwiGLU MLP on its post-attention norm of x."""
    gate, up = layer.gate_up(layer.post_norm(x)).chunk(2, dim=-1)
    return layer.down(F.silu(gate) * up)


def prefill_core(model: LeanModel, tokens: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                  packed: torch.Tensor, last: torch.Tensor, grid: torch.Tensor, ks: list[torch.Tensor],
                  vs: list[torch.Tensor], hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, pos, rows [N] long (real tokens row by row; pos from 0 in each row, rows = its cache slot); packed [N]
    each token's flat position r * T + j in the [B, T] grid, whose shape `grid` carries; last [B] each row's last
    token in [N] -> logits [B, V] float32 of each row's last token, hidden [N, W] or None."""
    b, t = grid.shape
    cos, sin = packed_rope(model, pos)  # [N, 1, hd]
    x = model.embed(tokens)  # [N, H]
    caught = []
    for i, layer in enumerate(model.layers):
        q, k, v = packed_qkv(layer, x, cos, sin, ks[i], vs[i], rows, pos)
        x = x + layer.o(causal_own(q, k, v, packed, b, t))
        x = x + mlp(layer, x)
        if i in hidden_layers:
            caught.append(x)
    hidden = torch.cat(caught, dim=-1) if caught else None
    return model.lm_head(model.norm(x[last])).float(), hidden


def prefill_inputs(n_new: list[int], slots: list[int], device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, Packing, torch.Tensor, torch.Tensor]:
    """(pos [N], rows [N], the Packing (its index [N]: each token's place in the grid), last [B], grid [B, T]) of
    rows with n_new[r] prompt tokens from position 0 in cache slots `slots`, the dynamic sizes marked for the
    compiled graph."""
    b, t = len(n_new), max(n_new)
    pack = Packing.of(n_new, t, device)
    pos = torch.cat([torch.arange(n) for n in n_new]).to(device)
    rows = torch.tensor([s for s, n in zip(slots, n_new, strict=True) for _ in range(n)], device=device)
    last = pack.last()
    grid = torch.empty(b, t, dtype=torch.uint8, device=device)
    for z in (pos, rows, pack.index):
        torch._dynamo.mark_dynamic(z, 0)
    torch._dynamo.mark_dynamic(grid, 1)
    if b > 1:
        torch._dynamo.mark_dynamic(grid, 0)
        torch._dynamo.mark_dynamic(last, 0)
    return pos, rows, pack, last, grid


def prefill_fits(tokens: torch.Tensor, cache: KVCache, slots: list[int], n_new: list[int]) -> bool:
    """Whether a last-only forward is a prefill the compiled graph takes: every row starts at position 0, has at
    least two tokens (a one-token size would be specialised), and fits its slot."""
    return (len(set(slots)) == len(slots) and min(n_new) >= 2 and tokens.shape[1] == max(n_new)
            and int(cache.lens[slots].max()) == 0 and max(n_new) <= cache.max_len)
