"""The DSpark drafter network: a DFlash-style parallel backbone + a sequential head + a confidence head.

Backbone (DESIGN.md section 4, DFlash): the hidden states of chosen target layers are concatenated,
projected to the model width and RMS-normed ("context features"); every draft layer turns them into extra
keys/values (own k/v projections, RoPE at the context positions) in front of the block's own keys/values.
Block input = embedding of the anchor x_0 + (gamma - 1) learned mask vectors at positions p..p+gamma-1;
attention is bidirectional inside the block and sees the context positions < p (all committed tokens but
the anchor). The anchor slot is itself a prediction position, so gamma inputs give gamma base logits U_k
and hidden states h_k in one forward. The embedding and the LM head are the target's, shared and frozen
(held outside this module's parameters and state dict).

Then `draft` samples left to right with p_k ~ softmax(U_k + B_k(x_{k-1}, ...)) (heads.py) and the raw
confidence logits c_k of the confidence head. `teacher_forced` gives the same quantities with the true
previous tokens, for training. The engine-side adapter (per-slot context cache, Drafter interface) is in
dspark_core/drafters/dspark_runtime.py; `build_drafter` below is the registry entry point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from dspark_core.drafters.heads import HEADS, ConfidenceHead, SequentialHead
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.argmax import top1
from dspark_core.modeling.model import RMSNorm, apply_rope, attend, rope_inv_freq
from dspark_core.verification.sampling import SamplingParams, sampling_probs

if TYPE_CHECKING:
    from dspark_core.drafters.draft_vocab import Columns


@dataclass
class DraftConfig:
    """Architecture of a DSpark drafter; width and vocabulary follow the target (shared embedding)."""

    vocab_size: int  # = target vocabulary
    hidden_size: int  # = target hidden size (the embedding and LM head are shared)
    target_layers: list[int]  # target decoder layers whose outputs form the context (0-based)
    block_size: int = 7  # gamma the drafter is trained for (slots per block forward)
    head: str = "markov"  # sequential head: none | markov | rnn
    markov_rank: int = 256  # r: width of W1 / W2 (and of the RNN state)
    num_layers: int = 2  # draft transformer layers
    num_heads: int = 4  # query heads per draft layer
    num_kv_heads: int = 2  # key/value heads per draft layer
    head_dim: int = 32  # width per head
    intermediate_size: int = 512  # SwiGLU inner width
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base (as the target's)
    mask_token_id: int | None = 0  # slots 1..G-1 embed this token with the target's table, as SGLang and vLLM
    # do (train-drafter takes the tokenizer's mask or end-of-text token); None: a learned mask vector (the older
    # dspark_config.json drafters; the engines cannot load those)
    extra: dict[str, object] = field(default_factory=dict)  # provenance (target path, training steps, ...)

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"unknown head {self.head!r}; choose one of {', '.join(HEADS)}")
        if not self.target_layers:
            raise ValueError("target_layers is empty; the backbone needs at least one target layer")
        from dspark_core.drafters.draft_schema import BLOCK_MAX, CONTEXT_LAYERS_MAX, DRAFT_LAYERS_MAX, RANK_MAX
        from dspark_core.modeling.config_schema import HEAD_DIM_MAX, HEADS_MAX, HIDDEN_MAX, INTERMEDIATE_MAX, VOCAB_MAX

        for name, hi in (("vocab_size", VOCAB_MAX), ("hidden_size", HIDDEN_MAX), ("block_size", BLOCK_MAX),
                         ("markov_rank", RANK_MAX), ("num_layers", DRAFT_LAYERS_MAX), ("num_heads", HEADS_MAX),
                         ("num_kv_heads", HEADS_MAX), ("head_dim", HEAD_DIM_MAX),
                         ("intermediate_size", INTERMEDIATE_MAX)):  # bounds as draft_schema.py documents them
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ValueError(f"{name} must be an integer in [1, {hi}], got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd; RoPE rotates pairs of channels")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} does not divide num_heads {self.num_heads}")
        if len(self.target_layers) > CONTEXT_LAYERS_MAX:
            raise ValueError(f"{len(self.target_layers)} target_layers; at most {CONTEXT_LAYERS_MAX}")
        if not all(isinstance(x, int) and 0 <= x for x in self.target_layers):
            raise ValueError(f"target_layers must be non-negative layer indices, got {self.target_layers}")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")

    def num_params(self) -> int:
        """Parameters DSparkDraftModel allocates for this config (the shared embedding and LM head excluded)."""
        h, r, v, hd = self.hidden_size, self.markov_rank, self.vocab_size, self.head_dim
        attn = h * hd * (2 * self.num_heads + 2 * self.num_kv_heads) + 2 * hd
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        head = v * r + (v * r if self.head in ("markov", "rnn") else 0)
        head += (2 * r + h) * 3 * r + 3 * r if self.head == "rnn" else 0
        mask = h if self.mask_token_id is None else 0
        return self.context_width * h + 2 * h + self.num_layers * layer + head + (h + r + 1) + mask

    @property
    def context_width(self) -> int:
        """Width of the concatenated target hidden states."""
        return len(self.target_layers) * self.hidden_size

    def rope_arch(self) -> ArchConfig:
        """An ArchConfig carrying what `rope_inv_freq` reads."""
        return ArchConfig(model_type="qwen3", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                          intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                          num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                          head_dim=self.head_dim, rope_theta=self.rope_theta)

    @classmethod
    def for_target(cls, arch: ArchConfig, **overrides: object) -> DraftConfig:
        """Defaults sized from the target: same width / heads, layers spread over the target's depth."""
        n = arch.num_hidden_layers
        picks = sorted({round(i * (n - 1) / 2) for i in range(3)}) if n >= 3 else list(range(n))
        base = dict(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, target_layers=picks,
                    num_heads=arch.num_attention_heads, num_kv_heads=arch.num_key_value_heads,
                    head_dim=arch.head_dim, intermediate_size=arch.intermediate_size,
                    rms_norm_eps=arch.rms_norm_eps, rope_theta=arch.rope_theta)
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]


class DraftLayer(nn.Module):
    """Pre-norm attention over [context keys; block keys] + SwiGLU MLP; Qwen3-style q/k norm."""

    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_heads, c.num_kv_heads, c.head_dim
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.q = nn.Linear(c.hidden_size, self.nh * self.hd, bias=False)
        self.kv = nn.Linear(c.hidden_size, 2 * self.nkv * self.hd, bias=False)
        self.o = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.post_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.gate_up = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, L, H] (already normed), cos/sin [B, L, 1, hd] -> k, v [B, L, nkv, hd] (k roped)."""
        b, n, _ = x.shape
        k, v = self.kv(x).view(b, n, 2, self.nkv, self.hd).unbind(2)
        return apply_rope(self.k_norm(k), cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, Q, H] block states; ctx_k/v [B, Lc, nkv, hd]; mask [B, 1, Q, Lc + Q] (True = attend)."""
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = apply_rope(self.q_norm(self.q(h).view(b, t, self.nh, self.hd)), cos, sin)
        k, v = self.keys_values(h, cos, sin)
        keys = torch.cat([ctx_k, k], dim=1).transpose(1, 2)  # [B, nkv, Lc + Q, hd]
        vals = torch.cat([ctx_v, v], dim=1).transpose(1, 2)
        attn = attend(q.transpose(1, 2), keys, vals, mask)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, self.nh * self.hd))
        gate, up = self.gate_up(self.post_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


@dataclass
class DraftOut:
    """A sampled block."""

    tokens: torch.Tensor  # [B, G] long: drafted tokens
    probs: torch.Tensor | None  # [B, G, V] float32 (CPU): q each token was drawn from; None = all greedy
    confidence_logits: torch.Tensor  # [B, G] raw confidence logits (before STS)
    entropy: torch.Tensor | None = None  # [B, G] entropy (nats) of the distribution each position drew from


@dataclass
class BlockOut:
    """One backbone forward over a block."""

    base_logits: torch.Tensor  # U [B, G, V] float32
    hidden: torch.Tensor  # h [B, G, H]: final-normed states (what the LM head, heads and confidence see)


class DSparkDraftModel(nn.Module):
    """Backbone + sequential head + confidence head; embedding / LM head are borrowed from the target."""

    def __init__(self, cfg: DraftConfig, embed: nn.Embedding, lm_head: nn.Linear) -> None:
        super().__init__()
        self.cfg = cfg
        self._shared = (embed, lm_head)  # a tuple: not registered, not trained, not saved
        h = cfg.hidden_size
        self.ctx_proj = nn.Linear(cfg.context_width, h, bias=False)  # concat(target layers) -> H
        self.ctx_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.mask_embed: nn.Parameter | None = None  # learned input of block slots 1..G-1 (older drafters only)
        if cfg.mask_token_id is None:
            self.mask_embed = nn.Parameter(torch.zeros(h))
            nn.init.normal_(self.mask_embed, std=0.02)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.head = SequentialHead(cfg.head, cfg.vocab_size, h, cfg.markov_rank)  # type: ignore[arg-type]
        self.confidence = ConfidenceHead(h, cfg.markov_rank)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rope_arch()), persistent=False)

    @property
    def embed(self) -> nn.Embedding:
        return self._shared[0]

    @property
    def param_dtype(self) -> torch.dtype:
        """The drafter's own weight dtype (what its activations run in); read off the final norm, which is never
        repacked (a oneDNN-packed projection's `weight` unpacks a copy)."""
        return self.norm.weight.dtype

    @property
    def param_device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos [B, L] -> cos, sin [B, L, 1, hd]."""
        freqs = pos.to(self.inv_freq.device).float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        dt = self.param_dtype
        return emb.cos().to(dt), emb.sin().to(dt)

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., len(target_layers) * H] target states -> [..., H] projected, RMS-normed features."""
        return self.ctx_norm(self.ctx_proj(target_hidden.to(self.param_dtype)))

    def context_kv(self, feats: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """feats [B, L, H] at positions pos [B, L] -> per draft layer (k, v) [B, L, nkv, hd]."""
        cos, sin = self.rope(pos)
        return [layer.keys_values(feats, cos, sin) for layer in self.layers]

    def mask_vector(self) -> torch.Tensor:
        """[H] input of block slots 1..G-1: the target's embedding of mask_token_id (or the learned vector)."""
        if self.mask_embed is not None:
            return self.mask_embed
        tok = torch.tensor(self.cfg.mask_token_id, device=self.embed.weight.device)
        return self.embed(tok).to(self.param_dtype)

    def block_inputs(self, anchors: torch.Tensor, g: int) -> torch.Tensor:
        """anchors [...] long -> [..., g, H]: anchor embedding then g - 1 mask inputs."""
        a = self.embed(anchors).to(self.param_dtype).unsqueeze(-2)  # [..., 1, H]
        m = self.mask_vector().expand(*anchors.shape, g - 1, self.cfg.hidden_size)
        return torch.cat([a, m], dim=-2)

    def backbone(self, x: torch.Tensor, pos: torch.Tensor, ctx: list[tuple[torch.Tensor, torch.Tensor]],
                 mask: torch.Tensor) -> BlockOut:
        """x [B, Q, H] block inputs at positions pos [B, Q]; ctx per layer; mask [B, 1, Q, Lc + Q] -> the block
        over the whole vocabulary (training)."""
        return self.block_out(self.layer_states(x, pos, ctx, mask))

    def layer_states(self, x: torch.Tensor, pos: torch.Tensor, ctx: list[tuple[torch.Tensor, torch.Tensor]],
                     mask: torch.Tensor) -> torch.Tensor:
        """`backbone` without its LM head -> h [B, Q, H] final-normed."""
        cos, sin = self.rope(pos)
        for layer, (ck, cv) in zip(self.layers, ctx, strict=True):
            x = layer(x, cos, sin, ck, cv, mask)
        return self.norm(x)

    def block_out(self, h: torch.Tensor, cols: Columns | None = None) -> BlockOut:
        """h [B, G, H] final-normed states -> the block: base logits through the shared LM head (over `cols`'
        columns where given, a reduced draft vocabulary: drafters/draft_vocab.py) beside h."""
        hh = h.to(self.embed.weight.dtype)
        return BlockOut(base_logits=(self.lm_head(hh) if cols is None else cols.logits(hh)).float(), hidden=h)

    def block_states(self, anchors: torch.Tensor, anchor_pos: torch.Tensor,
                     ctx: list[tuple[torch.Tensor, torch.Tensor]], ctx_valid: torch.Tensor, g: int) -> torch.Tensor:
        """One block per row (inference), without its LM head. anchors / anchor_pos [B]; ctx per layer [B, Lc, nkv,
        hd]; ctx_valid [B, Lc] bool (False = padding) -> h [B, g, H] final-normed (drafters/dspark_compiled.py runs
        this through torch.compile)."""
        b = anchors.shape[0]
        x = self.block_inputs(anchors, g)  # [B, g, H]
        pos = anchor_pos[:, None] + torch.arange(g, device=anchor_pos.device)[None]  # [B, g]
        block = torch.ones(b, g, g, dtype=torch.bool, device=ctx_valid.device)
        mask = torch.cat([ctx_valid[:, None, :].expand(b, g, -1), block], dim=-1)[:, None]  # [B,1,g,Lc+g]
        return self.layer_states(x, pos, ctx, mask)

    def forward_blocks(self, anchors: torch.Tensor, anchor_pos: torch.Tensor,
                       ctx: list[tuple[torch.Tensor, torch.Tensor]], ctx_valid: torch.Tensor,
                       g: int, keep: int | None = None, cols: Columns | None = None) -> BlockOut:
        """`block_states` then the LM head -> U [B, keep or g, V or M columns], h [B, keep or g, H]: a block of g
        slots, of which the first `keep` are drafted from (the rest still shape the others' states through
        bidirectional attention, but nobody samples from them)."""
        h = self.block_states(anchors, anchor_pos, ctx, ctx_valid, g)
        return self.block_out(h if keep is None else h[:, :keep], cols)

    def forward_packed(self, tokens: torch.Tensor, target_hidden: torch.Tensor, anchors: torch.Tensor
                       ) -> BlockOut:
        """Training: A blocks per sequence in one forward (anchor-bounded packing).

        tokens [N, T] long, target_hidden [N, T, W], anchors [N, A] positions p (1 <= p <= T - 1) ->
        U [N, A, G, V], h [N, A, G, H]. Block a sees context positions < p_a and its own G slots.
        """
        n, t = tokens.shape
        a, g = anchors.shape[1], self.cfg.block_size
        dev = tokens.device
        feats = self.context_features(target_hidden)  # [N, T, H]
        ctx = self.context_kv(feats, torch.arange(t, device=dev)[None].expand(n, t))
        x = self.block_inputs(tokens.gather(1, anchors), g).reshape(n, a * g, -1)  # [N, A*G, H]
        pos = (anchors[:, :, None] + torch.arange(g, device=dev)[None, None]).reshape(n, a * g)
        ctx_mask = torch.arange(t, device=dev)[None, None, :] < anchors[:, :, None]  # [N, A, T]
        ctx_mask = ctx_mask[:, :, None, :].expand(n, a, g, t).reshape(n, a * g, t)
        blk = torch.arange(a, device=dev).repeat_interleave(g)
        blk_mask = (blk[:, None] == blk[None, :])[None].expand(n, -1, -1)  # [N, A*G, A*G]
        mask = torch.cat([ctx_mask, blk_mask], dim=-1)[:, None]
        out = self.backbone(x, pos, ctx, mask)
        return BlockOut(out.base_logits.view(n, a, g, -1), out.hidden.view(n, a, g, -1))

    def teacher_forced(self, block: BlockOut, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits and raw confidences with the true previous tokens (training).

        block: U, h [..., G, *]; prev [..., G] long (x_0 = anchor, then ground-truth tokens) ->
        logits [..., G, V], confidence logits [..., G].
        """
        lead = prev.shape[:-1]
        g = prev.shape[-1]
        h = block.hidden.reshape(-1, g, block.hidden.shape[-1])
        bias, e = self.head.teacher_forced(prev.reshape(-1, g), h)
        logits = block.base_logits.reshape(-1, g, block.base_logits.shape[-1])
        if bias is not None:
            logits = logits + bias.float()
        conf = self.confidence(h, e)
        return logits.view(*lead, g, -1), conf.view(*lead, g)

    @torch.no_grad()
    def draft(self, block: BlockOut, anchors: torch.Tensor, sampling: list[SamplingParams],
              generators: list[torch.Generator | None] | None = None, g: int | None = None,
              entropy: bool = False, cols: Columns | None = None, stop: float = 0.0,
              inv_temps: torch.Tensor | None = None) -> DraftOut:
        """Left-to-right sampling of the block with the sequential bias (inference).

        block: U [B, G', V], h [B, G', H] from one backbone forward; anchors [B] long; sampling[b] the
        request's transform (greedy = argmax); g <= G' positions to draft. Position k samples from
        sampling_probs(U_k + B_k(x_{k-1}, state)) and the confidence head sees h_k and W1[x_{k-1}].
        `entropy`: also return the entropy of softmax(U_k + B_k) per position (the learned scheduler's feature;
        like the confidence, it is known before x_k is drawn). `cols`: U is over those columns (the block was
        computed with them) and so is the bias; tokens and `probs` come back as vocabulary ids / rows.
        `stop` (an all-greedy batch only): drafting ends after the first position where every row's survival,
        the product of its calibrated confidences sigmoid(c_k x inv_temps[k]), is below it; the block comes back
        shorter (DraftOut's G is the positions drafted).
        """
        g = block.base_logits.shape[1] if g is None else g
        if all(s.greedy for s in sampling) and not entropy and self.head.kind != "rnn":
            return self._greedy(block, anchors, g, cols, stop, inv_temps)
        return self._general(block, anchors, sampling, generators, g, entropy, cols)

    def _general(self, block: BlockOut, anchors: torch.Tensor, sampling: list[SamplingParams],
                 generators: list[torch.Generator | None] | None, g: int, entropy: bool, cols: Columns | None
                 ) -> DraftOut:
        """`draft`'s loop for any batch: sampled rows, the RNN head, entropies."""
        b = anchors.shape[0]
        gens = generators or [None] * b
        greedy = [s.greedy for s in sampling]
        tokens = torch.zeros(b, g, dtype=torch.long, device=anchors.device)
        probs = None if all(greedy) else torch.zeros(b, g, self.cfg.vocab_size)
        ids = None if cols is None else cols.ids.to(anchors.device)  # column -> token id
        prev, state = anchors, self.head.init_state(b, block.hidden)
        embedded = []  # W1[x_{k-1}] per position: the confidence head runs once on all of them below
        ent = torch.zeros(b, g) if entropy else None
        for k in range(g):
            h = block.hidden[:, k]
            bias, state, e = self.head.step(prev, h, state, cols)
            embedded.append(e)
            logits = block.base_logits[:, k] + (bias.float() if bias is not None else 0.0)  # [B, V or M]
            col = top1(logits)
            if ent is not None:
                logp = logits.float().log_softmax(-1)
                ent[:, k] = -(logp.exp() * logp).sum(-1).cpu()
            for i in range(b if probs is not None else 0):  # any sampled row (all-greedy: argmax is it)
                if greedy[i]:
                    continue
                q = sampling_probs(logits[i], sampling[i]).cpu()
                assert probs is not None
                if ids is None:
                    probs[i, k] = q
                else:
                    probs[i, k, ids.cpu()] = q  # the proposal lives on the columns, zero elsewhere
                col[i] = int(torch.multinomial(q, 1, generator=gens[i]))
            nxt = col if ids is None else ids[col]
            for i in range(b if probs is not None else 0):
                if greedy[i]:
                    probs[i, k, int(nxt[i])] = 1.0  # type: ignore[index]
            tokens[:, k] = nxt
            prev = nxt
        conf = self.confidence(block.hidden[:, :g], torch.stack(embedded, dim=1)).float()  # [B, g]
        return DraftOut(tokens=tokens, probs=probs, confidence_logits=conf, entropy=ent)

    def _greedy(self, block: BlockOut, anchors: torch.Tensor, g: int, cols: Columns | None, stop: float = 0.0,
                inv_temps: torch.Tensor | None = None) -> DraftOut:
        """`draft` for an all-greedy batch with the Markov (or no) head: W2's rows over the columns read as one
        matrix, so a position is one GEMM, an add and a max (the general loop's per-part GEMMs, concatenation and
        bookkeeping cost 1.97 ms a round at 8 requests x block 8 on SmolLM2-135M, bf16, AMX; this loop alone ~0.8).
        With `stop`, the confidence head runs at each position, its calibrated confidence (x inv_temps[k] before the
        sigmoid) folds into the rows' survival, and the loop ends once every row's is below `stop`: the scheduler
        would verify none of the rest (grid_costs.survival_floor)."""
        w2 = None
        if self.head.w2 is not None:
            w2 = self.head.w2.weight if cols is None or cols.w2 is None else (
                cols.w2[0] if len(cols.w2) == 1 else torch.cat(cols.w2))  # [M, r]
        ids = None if cols is None else cols.ids.to(anchors.device)  # column -> token id
        watch = stop > 0.0 and g > 1
        alive = torch.ones(anchors.shape[0], device=anchors.device)  # [B] survival of the drafts so far (watch)
        prev, toks, embedded, raws = anchors, [], [], []
        for k in range(g):
            e = self.head.w1(prev)  # [B, r]: W1[x_{k-1}]
            logits = block.base_logits[:, k] if w2 is None else block.base_logits[:, k] + F.linear(e, w2).float()
            col = top1(logits)
            prev = col if ids is None else ids[col]
            toks.append(prev)
            embedded.append(e)
            if watch:
                raws.append(self.confidence(block.hidden[:, k], e).float())  # [B] raw confidence of draft k
                scale = 1.0 if inv_temps is None else inv_temps[k]
                alive = alive * torch.sigmoid(raws[-1] * scale)
                if float(alive.max()) < stop:
                    break
        d = len(toks)
        conf = torch.stack(raws, dim=1) if watch else self.confidence(
            block.hidden[:, :d], torch.stack(embedded, dim=1)).float()  # [B, d]
        return DraftOut(tokens=torch.stack(toks, dim=1), probs=None, confidence_logits=conf)
