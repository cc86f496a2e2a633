"""A verify step that also prefills the requests admitted with it, in one `torch.compile` graph.

A request admitted while others run used to cost its own prefill forward before the round: on two AMX cores a
40-token prompt's compiled prefill took 26 ms, about a whole 8-row round, while 40 more tokens in an 8-row verify
step cost ~6 ms (SmolLM2-135M bf16; RESULTS.md, issue 42). The step's weights are read once either way, so the
prompts ride along: their tokens go through the same projections, MLP and LM head as the verify tokens, and only
attention is split. Verify rows attend over their slots' cache on the [Bv, Tv] grid (as `compiled._core` packed);
prompt rows, fresh slots from position 0, attend causally over their own keys on the [Bp, Tp] grid (as
`compiled_prefill.prefill_core`). vLLM's chunked prefill and SGLang's mixed chunks batch prefills with decodes the
same way. A long prompt's own prefill is mostly compute, which mixing does not share, while its request joins the
batch a round later: the engine mixes admissions of up to `batch.mixed_prefill_tokens` prompt tokens (RESULTS.md).

Every size is dynamic (rows, tokens per row, real tokens, keys of both parts), so one graph serves every mix. A
size of 1 would be specialised, so `mixed_inputs` pads each to at least 2: a verify grid row that repeats the last
real row's slot (no real tokens: it writes nothing), a grid column past every row's tokens, an empty prompt row.
"""

from __future__ import annotations

import torch

from dspark_core.modeling.compiled_prefill import causal_own, mlp, on_grid, packed_qkv, packed_rope, prefill_inputs
from dspark_core.modeling.model import KVCache, LeanModel, Packing, attend, prefix_lens


def mixed_core(model: LeanModel, vtok: torch.Tensor, vpos: torch.Tensor, vslots: torch.Tensor,
               vpacked: torch.Tensor, span: torch.Tensor, ptok: torch.Tensor, ppos: torch.Tensor,
               prows: torch.Tensor, ppacked: torch.Tensor, plast: torch.Tensor, pgrid: torch.Tensor,
               ks: list[torch.Tensor], vs: list[torch.Tensor], hidden_layers: tuple[int, ...]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vtok, vpos [Bv, Tv] long the verify grid (positions from each slot's length); vslots [Bv]; vpacked [Nv] each
    real verify token's flat grid position; span [Lk] = arange(Lk); ptok, ppos, prows [Np] the prompts' tokens
    packed (pos from 0, rows = their slots); ppacked [Np] their places on the prompt grid, whose shape `pgrid`
    [Bp, Tp] carries; plast [Lp] the packed index of each prompt's last token
    -> logits [Nv + Lp, V] float32 (every verify token, then each prompt's last), hidden [Nv + Np, W] or None."""
    bv, tv = vtok.shape
    bp, tp = pgrid.shape
    nv = vpacked.shape[0]
    mask = (span[None, None, :] <= vpos[:, :, None])[:, None]  # [Bv, 1, Tv, Lk]
    vlens = prefix_lens(vpos, vpacked)  # [Bv, Tv], 0 at the grid's padding queries
    vrows = vslots[:, None].expand(bv, tv).reshape(-1)[vpacked]
    tokens = torch.cat([vtok.reshape(-1)[vpacked], ptok])  # [N] = [Nv + Np]
    pos = torch.cat([vpos.reshape(-1)[vpacked], ppos])
    rows = torch.cat([vrows, prows])
    cos, sin = packed_rope(model, pos)  # [N, 1, hd]
    x = model.embed(tokens)  # [N, H]
    caught = []
    for i, layer in enumerate(model.layers):
        nh, hd = layer.nh, layer.hd
        q, k, v = packed_qkv(layer, x, cos, sin, ks[i], vs[i], rows, pos)
        keys = ks[i][vslots, : span.shape[0]].to(q.dtype).transpose(1, 2)  # [Bv, nkv, Lk, hd]
        vals = vs[i][vslots, : span.shape[0]].to(q.dtype).transpose(1, 2)
        av = attend(on_grid(q[:nv], vpacked, bv, tv), keys, vals, mask, vlens)  # [Bv, nh, Tv, hd]
        av = av.transpose(1, 2).reshape(bv * tv, nh * hd)
        av = av[vpacked]  # [Nv, nh * hd]
        x = x + layer.o(torch.cat([av, causal_own(q[nv:], k[nv:], v[nv:], ppacked, bp, tp)]))
        x = x + mlp(layer, x)
        if i in hidden_layers:
            caught.append(x)
    hidden = torch.cat(caught, dim=-1) if caught else None
    out = torch.cat([x[:nv], x[nv:][plast]])  # [Nv + Lp, H]
    return model.lm_head(model.norm(out)).float(), hidden


def mixed_fits(cache: KVCache, slots: list[int], pslots: list[int], plens: list[int], t_max: int) -> bool:
    """Whether a verify step of rows `slots` (up to t_max tokens each) and the prompts of fresh slots `pslots` (plens
    tokens each) go through the mixed graph: distinct slots, two tokens or more a prompt (a size of 1 would be
    specialised), every row within its slot."""
    every = slots + pslots
    return (len(set(every)) == len(every) and min(plens) >= 2 and max(plens) <= cache.max_len
            and int(cache.lens[slots].max()) + max(t_max, 2) <= cache.max_len and int(cache.lens[pslots].max()) == 0)


def mixed_inputs(cache: KVCache, slots: list[int], n_new: list[int], t_pad: int, pslots: list[int],
                 plens: list[int], device: torch.device) -> dict[str, torch.Tensor | Packing]:
    """The mixed graph's index tensors, sizes padded to >= 2 and marked dynamic: the verify grid's positions
    `vpos` [Bv, Tv] and slots `vslots` [Bv] (a one-row batch gets a grid-only second row), its packing `vpack`, the
    prompts' `ppos`, `prows`, packing `ppack`, `plast` and `pgrid` (one prompt gets an empty second grid row and
    its last token twice), and the key span `span` [Lk]."""
    b, bv, tv = len(slots), max(len(slots), 2), max(t_pad, 2)
    starts = cache.lens[slots]
    vpos = starts[:, None] + torch.arange(tv)[None, :]  # [B, Tv]
    vslots = torch.tensor(slots + [slots[-1]] * (bv - b), dtype=torch.long)
    if bv > b:
        vpos = torch.cat([vpos, vpos[-1:]])
    vpack = Packing.of(n_new, tv, device)
    ppos, prows, ppack, plast, _ = prefill_inputs(plens, pslots, device)
    pgrid = torch.empty(max(len(plens), 2), max(plens), dtype=torch.uint8, device=device)
    if len(plens) == 1:
        plast = plast.repeat(2)
    span = torch.arange(max(int(starts.max()) + tv, 2), device=device)
    out = {"vpos": vpos.to(device), "vslots": vslots.to(device), "vpack": vpack, "ppos": ppos, "prows": prows,
           "ppack": ppack, "plast": plast, "pgrid": pgrid, "span": span}
    for z in (out["vpos"], pgrid):
        torch._dynamo.mark_dynamic(z, 0)
        torch._dynamo.mark_dynamic(z, 1)
    for z in (out["vslots"], vpack.index, ppos, prows, ppack.index, plast, span):
        torch._dynamo.mark_dynamic(z, 0)
    return out
