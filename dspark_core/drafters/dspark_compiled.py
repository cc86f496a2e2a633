"""The DSpark drafter's backbone through `torch.compile` (issue 41: "decode, verify and the drafter's forward").

* `states`: the block inputs, every draft layer over [context; block] keys and the final norm -> h [B, G, H]. The
  rows' context keys/values are gathered inside the graph from the drafter's per-slot buffers (their slot count
  and capacity are dynamic sizes, so a growing buffer never recompiles); the context length Lc is dynamic, and so
  are the rows B from 2 up (a lone request is its own graph: dynamo specialises size 1). SmolLM2-135M's drafter,
  8 rows x block 8, 250 context positions, bf16, 2 threads (Intel Xeon, AMX): 1.57 ms eager, 1.36 compiled, 1.22
  compiled with oneDNN-packed projections (dspark_runtime packs the drafter's layers where the target's are).
* Not compiled: writing the keys/values of a round's committed positions (`update`, ~0.5 ms at 8 requests: one
  graph measured the same, 0.46 against 0.46-0.50 ms eager; its GEMMs are most of it, now oneDNN-packed).

The LM head stays outside (the target's oneDNN-packed linear on a CPU, or a reduced vocabulary's columns), and so
does the sequential head's left-to-right loop: compiled, its small bf16 GEMMs ran 2.6x slower than eager's (8 rows
x 8 positions over 8,400 columns: 2.03 against 0.79 ms; `DSparkDraftModel._greedy` is the lean eager loop). In
fp32 the compiled states and keys equal eager's to rounding and the drafted tokens are the same (tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_FN: list[Callable] = []  # the compiled backbone, made once per process (drafters share its graphs)


def _states(model, anchors: torch.Tensor, anchor_pos: torch.Tensor, idx: torch.Tensor, span: torch.Tensor,  # noqa: ANN001
            valid: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], g: int) -> torch.Tensor:
    """`DSparkDraftModel.block_states` over the rows' contexts read from the buffers. idx [B] long: the rows'
    slots; span [Lc] (dynamic; its length is the read); valid [B, Lc] bool; ks / vs per layer [slots, capacity,
    nkv, hd] -> h [B, g, H]."""
    at = (idx[:, None], span[None, :])  # a gather, not a slice: a slice would specialise Lc == capacity apart
    ctx = [(k[at], v[at]) for k, v in zip(ks, vs, strict=True)]
    return model.block_states(anchors, anchor_pos, ctx, valid, g)


def _dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """Mark `dims` of `t` dynamic where they are >= 2 (dynamo specialises 0 and 1); `maybe_`, since sizes of one
    symbol meet (the rows of every input)."""
    for d in dims:
        if t.shape[d] >= 2:
            torch._dynamo.maybe_mark_dynamic(t, d)
    return t


def states(model, anchors: torch.Tensor, anchor_pos: torch.Tensor, slots: list[int], lens: list[int],  # noqa: ANN001
           kbuf: list[torch.Tensor], vbuf: list[torch.Tensor], g: int) -> torch.Tensor:
    """The compiled backbone for rows in `slots` holding `lens` context positions each -> h [B, g, H]."""
    dev = anchors.device
    lc = max(2, *lens)  # the span is a dynamic size: never 1 (dynamo would specialise it); valid masks the extra
    idx = torch.tensor(slots, device=dev)
    span = torch.arange(lc, device=dev)
    valid = span[None] < anchor_pos[:, None]  # [B, Lc]: anchor_pos is each row's context length
    for t in (anchors, anchor_pos, idx):
        _dynamic(t, 0)
    _dynamic(span, 0)
    _dynamic(valid, 0, 1)
    for buf in (*kbuf, *vbuf):
        _dynamic(buf, 0, 1)
    if not _FN:
        _FN.append(torch.compile(_states, dynamic=None))
    return _FN[0](model, anchors, anchor_pos, idx, span, valid, kbuf, vbuf, g)
