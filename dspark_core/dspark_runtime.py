"""The DSpark drafter in the engine: the `Drafter` interface (drafters/base.py) over DSparkDraftModel.

Per slot it keeps the draft layers' context keys/values of every committed position but the anchor:
`reset` computes them for the prompt, `update` appends the rows of the positions that entered the target
KV this round (the old anchor + the accepted draft tokens), so nothing is ever recomputed and a rejected
suffix never enters. `propose` runs one backbone forward over a block of `block_size` slots per request
(the length the drafter was trained with; a longer block if a request asks for more), samples left to
right with the sequential head, and returns the STS-calibrated confidences for the scheduler.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dspark_core.calibrate import StsCalibration
from dspark_core.config import ASSETS
from dspark_core.drafter import CONFIG_FILE, DSparkDraftModel, load_drafter
from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult
from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig
    from dspark_core.model import LeanModel

STS_FILE = "sts.json"  # calibration shipped next to a trained drafter
METHOD_NAMES = {"none": "dflash", "markov": "dspark_markov", "rnn": "dspark_rnn"}  # head -> bench method


class DSparkDrafter(Drafter):
    """Semi-autoregressive drafting with confidences; one backbone forward per round for the batch."""

    def __init__(self, model: DSparkDraftModel, sts: StsCalibration | None = None) -> None:
        self.model = model
        self.name = METHOD_NAMES[model.cfg.head]
        self.hidden_layers = tuple(model.cfg.target_layers)
        self.sts = sts
        self.ctx: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # slot -> per layer (k, v) [L, nkv, hd]

    def _kv(self, hidden: torch.Tensor, start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """hidden [n, W] target states of positions start..start+n-1 -> per layer (k, v) [n, nkv, hd]."""
        dev = self.model.mask_embed.device
        feats = self.model.context_features(hidden.to(dev)[None])
        pos = torch.arange(start, start + hidden.shape[0], device=dev)[None]
        return [(k[0], v[0]) for k, v in self.model.context_kv(feats, pos)]

    @torch.inference_mode()
    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        if hidden is None:
            raise DSparkError("the DSpark drafter needs target hidden states; the engine did not pass them")
        self.ctx[slot] = self._kv(hidden, 0)

    def context_len(self, slot: int) -> int:
        """Committed positions (all tokens but the anchor) held for `slot`."""
        return int(self.ctx[slot][0][0].shape[0])

    def _calibrated(self, raw: torch.Tensor) -> torch.Tensor:
        """raw confidence logits [B, G] -> sigmoid(raw / T_k) (T = 1 past the calibrated positions)."""
        if self.sts is None:
            return torch.sigmoid(raw)
        g = raw.shape[-1]
        temps = (self.sts.temperatures + [1.0] * g)[:g]
        return torch.sigmoid(raw / torch.tensor(temps, dtype=raw.dtype, device=raw.device))

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> Proposal:
        b = len(requests)
        g = max((r.gamma for r in requests), default=0)
        rows = [i for i, r in enumerate(requests) if r.gamma > 0]
        tokens = torch.zeros(b, g, dtype=torch.long)
        conf = torch.zeros(b, g)
        if not rows:
            return Proposal(tokens=tokens, num=[0] * b)
        dev = self.model.mask_embed.device
        lens = [self.context_len(requests[i].slot) for i in rows]
        for i, n in zip(rows, lens, strict=True):
            if n != len(requests[i].tokens) - 1:
                raise DSparkError(f"DSpark drafter out of step on slot {requests[i].slot}: {n} context positions "
                                  f"for {len(requests[i].tokens)} tokens (engine must reset/update every round)")
        lmax = max(lens)
        ctx = []
        for layer in range(len(self.model.layers)):
            if len(rows) == 1:  # one request: its cached K/V as they are, no padded copy
                k, v = self.ctx[requests[rows[0]].slot][layer]
                ctx.append((k[None], v[None]))
                continue
            k0 = self.ctx[requests[rows[0]].slot][layer][0]
            ks = k0.new_zeros(len(rows), lmax, *k0.shape[1:])
            vs = k0.new_zeros(len(rows), lmax, *k0.shape[1:])
            for j, i in enumerate(rows):
                k, v = self.ctx[requests[i].slot][layer]
                ks[j, : k.shape[0]], vs[j, : v.shape[0]] = k, v
            ctx.append((ks, vs))
        valid = torch.arange(lmax, device=dev)[None] < torch.tensor(lens, device=dev)[:, None]
        anchors = torch.tensor([requests[i].tokens[-1] for i in rows], device=dev)
        g_run = max(self.model.cfg.block_size, g)
        block = self.model.forward_blocks(anchors, torch.tensor(lens, device=dev), ctx, valid, g_run)
        out = self.model.draft(block, anchors, [requests[i].sampling for i in rows],
                               [requests[i].generator for i in rows], g=g)
        tokens[rows] = out.tokens.cpu()
        conf[rows] = self._calibrated(out.confidence_logits.float()).cpu()
        probs = None
        if out.probs is not None:
            probs = torch.zeros(b, g, out.probs.shape[-1])
            probs[rows] = out.probs
        return Proposal(tokens=tokens, num=[r.gamma for r in requests], probs=probs, confidence=conf)

    @torch.inference_mode()
    def update(self, results: list[RoundResult]) -> None:
        for res in results:
            if res.slot not in self.ctx or res.hidden is None or res.finished:
                continue
            start = self.context_len(res.slot)
            new = self._kv(res.hidden, start)
            self.ctx[res.slot] = [(torch.cat([k, nk]), torch.cat([v, nv]))
                                  for (k, v), (nk, nv) in zip(self.ctx[res.slot], new, strict=True)]

    def release(self, slot: int) -> None:
        self.ctx.pop(slot, None)


def drafter_folder(config: EngineConfig) -> Path:
    """`drafter.path` when it holds a DSpark drafter, else the committed tiny drafter for `spec.head`."""
    if config.drafter.path and (Path(config.drafter.path) / CONFIG_FILE).is_file():
        return Path(config.drafter.path)
    return ASSETS / "drafters" / config.spec.head


def build_runtime(config: EngineConfig, target: LeanModel) -> DSparkDrafter:
    """Load the drafter (and its STS calibration: `spec.sts_path`, else sts.json beside it, else none)."""
    folder = drafter_folder(config)
    model = load_drafter(folder, target)
    if model.cfg.head != config.spec.head:
        raise DSparkError(f"drafter {folder} has head {model.cfg.head!r} but spec.head is {config.spec.head!r}; "
                          "set spec.head to match or point drafter.path to a matching drafter")
    sts_path = Path(config.spec.sts_path) if config.spec.sts_path else folder / STS_FILE
    sts = StsCalibration.load(sts_path) if (config.spec.sts_path or sts_path.is_file()) else None
    return DSparkDrafter(model, sts)
