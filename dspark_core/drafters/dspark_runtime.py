"""The DSpark drafter in the engine: the `Drafter` interface (drafters/base.py) over DSparkDraftModel.

Per slot it keeps the draft layers' context keys/values of every committed position but the anchor, in
preallocated per-layer buffers [slots, capacity, nkv, hd] (grown by doubling): `reset` computes them for
the prompt, `update` writes the rows of the positions that entered the target KV this round (the old
anchor + the accepted draft tokens; one projection for the whole batch), so nothing is ever recomputed or
concatenated and a rejected suffix never enters. Consecutive slots are read as a view. `propose` runs one
backbone forward over a block of `block_size` slots per request (the length the drafter was trained with;
a longer block if a request asks for more; only the first gamma slots go through the LM head), samples
left to right with the sequential head, and returns the STS-calibrated confidences for the scheduler.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult
from dspark_core.drafters.draft_vocab import DraftVocab, build_vocab
from dspark_core.drafters.dspark import DSparkDraftModel
from dspark_core.drafters.dspark_layout import is_drafter, load_drafter, read_drafter_config
from dspark_core.errors import DSparkError
from dspark_core.verification.calibrate import StsCalibration
from dspark_core.verification.sampling import SamplingParams

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig
    from dspark_core.modeling.model import LeanModel

STS_FILE = "sts.json"  # calibration shipped next to a trained drafter
METHOD_NAMES = {"none": "dflash", "markov": "dspark_markov", "rnn": "dspark_rnn"}  # head -> bench method


class DSparkDrafter(Drafter):
    """Semi-autoregressive drafting with confidences; one backbone forward per round for the batch."""

    def __init__(self, model: DSparkDraftModel, sts: StsCalibration | None = None, vocab: DraftVocab | None = None
                 ) -> None:
        self.model = model
        self.vocab = vocab  # a reduced draft vocabulary (drafters/draft_vocab.py); None = the whole vocabulary
        self.name = METHOD_NAMES[model.cfg.head]
        self.hidden_layers = tuple(model.cfg.target_layers)
        self.sts = sts
        self.want_entropy = False  # the learned scheduler (or a round log) asks for per-position draft entropies
        self.kbuf: list[torch.Tensor] = []  # per draft layer [slots, capacity, nkv, hd]: context keys
        self.vbuf: list[torch.Tensor] = []  # per draft layer [slots, capacity, nkv, hd]: context values
        self.lens: dict[int, int] = {}  # slot -> context positions held (all committed tokens but the anchor)
        self.compiled = False  # the backbone through torch.compile (drafters/dspark_compiled.py; `compile: true`)

    def _kv(self, hidden: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """hidden [n, W] target states at positions pos [n] -> per layer (k, v) [n, nkv, hd]."""
        dev = self.model.param_device
        feats = self.model.context_features(hidden.to(dev)[None])
        return [(k[0], v[0]) for k, v in self.model.context_kv(feats, pos.to(dev)[None])]

    def _reserve(self, slot: int, need: int, like: torch.Tensor) -> None:
        """Make room for `need` positions in `slot` (slots and capacity grow by doubling; O(1) amortised)."""
        slots, cap = (self.kbuf[0].shape[0], self.kbuf[0].shape[1]) if self.kbuf else (0, 0)
        if slot < slots and need <= cap:
            return
        new_slots, new_cap = max(slots, slot + 1), max(cap, 64)
        while new_cap < need:
            new_cap *= 2
        shape = (new_slots, new_cap, *like.shape[1:])
        for buf in (self.kbuf, self.vbuf):
            for i in range(len(self.model.layers)):
                grown = like.new_zeros(shape)
                if i < len(buf):
                    grown[:slots, :cap] = buf[i]
                    buf[i] = grown
                else:
                    buf.append(grown)

    def _write(self, slot: int, start: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        n = kv[0][0].shape[0]
        self._reserve(slot, start + n, kv[0][0])
        for i, (k, v) in enumerate(kv):
            self.kbuf[i][slot, start : start + n] = k
            self.vbuf[i][slot, start : start + n] = v
        self.lens[slot] = start + n

    @torch.inference_mode()
    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        if hidden is None:
            raise DSparkError("the DSpark drafter needs target hidden states; the engine did not pass them")
        self._write(slot, 0, self._kv(hidden, torch.arange(hidden.shape[0])))
        if self.vocab is not None:
            self.vocab.forget(slot)

    def context_len(self, slot: int) -> int:
        """Committed positions (all tokens but the anchor) held for `slot`."""
        return self.lens[slot]

    def context(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer (k, v) [context_len, nkv, hd] of `slot` (views of the buffers)."""
        n = self.lens[slot]
        return [(k[slot, :n], v[slot, :n]) for k, v in zip(self.kbuf, self.vbuf, strict=True)]

    def _inv_temps(self, g: int) -> torch.Tensor:
        """[g] 1 / T_k of the STS calibration (1 past the calibrated positions, and without one)."""
        temps = ((self.sts.temperatures if self.sts is not None else []) + [1.0] * g)[:g]
        return 1.0 / torch.tensor(temps, dtype=torch.float32)

    def _calibrated(self, raw: torch.Tensor) -> torch.Tensor:
        """raw confidence logits [B, G] -> sigmoid(raw / T_k) (T = 1 past the calibrated positions)."""
        if self.sts is None:
            return torch.sigmoid(raw)
        return torch.sigmoid(raw * self._inv_temps(raw.shape[-1]).to(raw))

    def _ctx(self, slots: list[int], lmax: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer (k, v) [B, lmax, nkv, hd] of `slots`: views where they are consecutive, else a gather."""
        if slots == list(range(slots[0], slots[0] + len(slots))):  # consecutive slots: views, nothing copied
            return [(k[slots[0] : slots[-1] + 1, :lmax], v[slots[0] : slots[-1] + 1, :lmax])
                    for k, v in zip(self.kbuf, self.vbuf, strict=True)]
        idx = torch.tensor(slots, device=self.model.param_device)
        return [(k[idx, :lmax], v[idx, :lmax]) for k, v in zip(self.kbuf, self.vbuf, strict=True)]

    @torch.inference_mode()
    def warm(self, rows: int) -> str:
        """Compile (or load from disk) the compiled backbone's graphs, for one row and for several (`rows` > 1), on
        placeholder contexts in free slots, before the engine serves or is timed; what it did ("" when eager)."""
        if not self.compiled:
            return ""
        t0 = time.perf_counter()
        width = len(self.hidden_layers) * self.model.cfg.hidden_size
        block = self.model.cfg.block_size
        sizes = sorted({1, min(rows, 2)})
        for slot in range(max(2, rows)):  # buffers of several slots: their slot count is a dynamic size
            self.reset(slot, [0] * 8, torch.zeros(8, width))
        for b in sizes:
            self.propose([DraftRequest(slot=slot, tokens=[0] * 9, gamma=block, sampling=SamplingParams())
                          for slot in range(b)])
        for slot in range(max(2, rows)):
            self.release(slot)
        return f"drafter rounds of {' and '.join(map(str, sizes))}+ rows in {time.perf_counter() - t0:.1f} s"

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> Proposal:
        b = len(requests)
        g = max((r.gamma for r in requests), default=0)
        rows = [i for i, r in enumerate(requests) if r.gamma > 0]
        tokens = torch.zeros(b, g, dtype=torch.long)
        conf = torch.zeros(b, g)
        if not rows:
            return Proposal(tokens=tokens, num=[0] * b)
        dev = self.model.param_device
        lens = [self.context_len(requests[i].slot) for i in rows]
        for i, n in zip(rows, lens, strict=True):
            if n != len(requests[i].tokens) - 1:
                raise DSparkError(f"DSpark drafter out of step on slot {requests[i].slot}: {n} context positions "
                                  f"for {len(requests[i].tokens)} tokens (engine must reset/update every round)")
        lmax = max(lens)
        slots = [requests[i].slot for i in rows]
        anchors = torch.tensor([requests[i].tokens[-1] for i in rows], device=dev)
        g_run = max(self.model.cfg.block_size, g)
        cols = None if self.vocab is None else self.vocab.columns([(requests[i].slot, requests[i].tokens)
                                                                     for i in rows])
        pos = torch.tensor(lens, device=dev)
        if self.compiled:  # the backbone through torch.compile (drafters/dspark_compiled.py), the LM head after
            from dspark_core.drafters.dspark_compiled import states

            h = states(self.model, anchors, pos, slots, lens, self.kbuf, self.vbuf, g_run)
            block = self.model.block_out(h[:, :g], cols)
        else:
            valid = torch.arange(lmax, device=dev)[None] < pos[:, None]
            block = self.model.forward_blocks(anchors, pos, self._ctx(slots, lmax), valid, g_run, keep=g, cols=cols)
        out = self.model.draft(block, anchors, [requests[i].sampling for i in rows],
                               [requests[i].generator for i in rows], g=g, entropy=self.want_entropy, cols=cols,
                               stop=self.stop_below, inv_temps=self._inv_temps(g).to(dev) if self.stop_below else None)
        d = out.tokens.shape[1]  # positions drafted: g, or fewer where every row fell below stop_below
        tokens[rows, :d] = out.tokens.cpu()
        conf[rows, :d] = self._calibrated(out.confidence_logits.float()).cpu()
        probs = None
        if out.probs is not None:
            probs = torch.zeros(b, g, out.probs.shape[-1])
            probs[rows] = out.probs
        ent = None
        if out.entropy is not None:
            ent = torch.zeros(b, g)
            ent[rows] = out.entropy
        return Proposal(tokens=tokens, num=[min(r.gamma, d) for r in requests], probs=probs, confidence=conf,
                        entropy=ent)

    @torch.inference_mode()
    def update(self, results: list[RoundResult]) -> None:
        live = [res for res in results if res.slot in self.lens and res.hidden is not None and not res.finished]
        if not live:
            return
        starts = [self.lens[res.slot] for res in live]
        hidden = torch.cat([res.hidden for res in live])  # type: ignore[misc]  # [sum n, W]: one projection
        sizes = [res.hidden.shape[0] for res in live]  # type: ignore[union-attr]
        pos = torch.cat([torch.arange(st, st + n) for st, n in zip(starts, sizes, strict=True)])  # [sum n]
        kv = self._kv(hidden, pos)
        at = 0
        for st, n, res in zip(starts, sizes, live, strict=True):
            self._write(res.slot, st, [(k[at : at + n], v[at : at + n]) for k, v in kv])
            at += n

    def release(self, slot: int) -> None:
        self.lens.pop(slot, None)
        if self.vocab is not None:
            self.vocab.forget(slot)


def drafter_folder(config: EngineConfig) -> Path:
    """The DSpark drafter's folder: `drafter.path` (a folder or a Hugging Face model id in the local cache), or the
    committed drafter for `spec.head` of the tiny target or a fetched model (config.drafter_path); one DSparkError
    line otherwise."""
    from dspark_core.config import drafter_path
    from dspark_core.modeling.checkpoint import checkpoint_folder

    path = drafter_path(config, "dspark")
    if path is None:
        raise DSparkError("drafter.path is not set: point it at a DSpark drafter for this target (a folder or a "
                          "model id), or train one with `python cli.py train-drafter`")
    folder = checkpoint_folder(path)
    if not is_drafter(folder):
        if (folder / "config.json").is_file():
            read_drafter_config(folder)  # names what is wrong with the file (a JSON list, no markov_rank, ...)
        raise DSparkError(f"drafter.path {path} holds no DSpark drafter (config.json with dflash_config + "
                          "model.safetensors); train one with `python cli.py train-drafter`")
    return folder


def build_runtime(config: EngineConfig, target: LeanModel) -> DSparkDrafter:
    """Load the drafter (and its STS calibration: `spec.sts_path`, else sts.json beside it, else none)."""
    folder = drafter_folder(config)
    model = load_drafter(folder, target)
    if model.cfg.head != config.spec.head:
        raise DSparkError(f"drafter {folder} has head {model.cfg.head!r} but spec.head is {config.spec.head!r}; "
                          "set spec.head to match or point drafter.path to a matching drafter")
    sts_path = Path(config.spec.sts_path) if config.spec.sts_path else folder / STS_FILE
    sts = StsCalibration.load(sts_path) if (config.spec.sts_path or sts_path.is_file()) else None
    def weights() -> tuple[torch.Tensor, torch.Tensor | None]:
        """Plain LM-head and W2 rows: a tied target's embedding is its LM head, and reading it copies nothing (a
        CPU engine holds the LM head only in oneDNN's packed layout, whose `weight` unpacks a copy)."""
        with torch.no_grad():
            lm = target.embed.weight if target.arch.tie_word_embeddings else model.lm_head.weight
            w2 = model.head.w2.weight if model.head.w2 is not None else None
            return lm.detach(), None if w2 is None else w2.detach()

    drafter = DSparkDrafter(model, sts, build_vocab(folder, config.drafter.draft_vocab, model.cfg.vocab_size, weights))
    drafter.compiled = bool(config.compile) and model.param_device.type == "cpu"  # measured on CPUs only
    _pack_like(model, target)
    return drafter


def _pack_like(model: DSparkDraftModel, target: LeanModel) -> None:
    """The drafter's projections in oneDNN's packed layout where the target's are (`weights.cpu_kernel`): at 8 rows x
    block 8 the compiled backbone took 1.22 ms packed against 1.36 (drafters/dspark_compiled.py), and the context
    projection of a round's committed positions (16 rows) is a third of `update` unpacked."""
    from torch import nn

    from dspark_core.modeling.cpu_linear import PackedLinear, supported

    if not target.layers or type(target.layers[0].o) is not PackedLinear or not supported(model.param_dtype):
        return
    if type(model.ctx_proj) is nn.Linear:
        model.ctx_proj = PackedLinear(model.ctx_proj)
    for layer in model.layers:
        for name in ("q", "kv", "o", "gate_up", "down"):
            if type(getattr(layer, name)) is nn.Linear:
                setattr(layer, name, PackedLinear(getattr(layer, name)))
