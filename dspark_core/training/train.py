"""Training a DSpark drafter against a frozen target (DSpark paper, section 3.3).

Data: prompts (windows of source files) continued by the target itself; only positions inside the
target-generated continuation serve as anchors. Each step samples sequences, runs the frozen target once
over them (logits p_t and the hidden states of the chosen layers), draws `anchors_per_seq` random anchors
per sequence and trains all blocks in one packed forward (DSparkDraftModel.forward_packed). Loss, with
position weights w_k = exp(-(k-1)/gamma):

    0.1 * sum_k w_k CE(p_d_k, x*_k) + 0.9 * sum_k w_k ||p_d_k - p_t_k||_1 + 1.0 * sum_k w_k BCE(c_k, c*_k),
    c*_k = 1 - 0.5 ||p_d_k - p_t_k||_1 (detached),

with teacher forcing for the sequential head (x_{k-1} = the true previous token). The target's embedding
and LM head are shared and frozen; only the backbone, the head and the confidence head train.
Checkpoints (weights + optimiser + step + data) go to `out/train_state.pt`; a rerun resumes from there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from dspark_core.atomic import atomic_write
from dspark_core.drafters.dspark import DraftConfig, DSparkDraftModel
from dspark_core.drafters.dspark_layout import save_drafter
from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel

STATE_FILE = "train_state.pt"  # resumable training state inside the output folder
DATA_FILE = "train_data.pt"  # target-generated sequences (cached so a resume reuses them)


@dataclass
class LossWeights:
    """Weights of the three loss terms (paper defaults)."""

    ce: float = 0.1  # cross-entropy to the ground-truth token
    tv: float = 0.9  # L1 distance between draft and target distributions
    conf: float = 1.0  # BCE of the confidence head against 1 - TV
    kl: float = 0.0  # forward KL(p_t || p_d) over the target's top-K; not in the paper (0 = its loss), it pulls a
    # far-off draft towards the target faster than TV, whose gradient vanishes while p_d is spread thin


@dataclass
class TrainConfig:
    """What `train-drafter` does; every field has a CLI option of the same name."""

    head: str = "markov"  # none | markov | rnn
    block_size: int = 16  # gamma trained for (inference may draft any gamma <= this)
    num_layers: int = 2  # draft transformer layers
    markov_rank: int = 64  # r of W1 / W2 (and RNN state width)
    intermediate_size: int = 0  # SwiGLU width of the draft layers (0 = the target's)
    target_layers: list[int] = field(default_factory=list)  # target layers for the context ([] = spread)
    mask_token_id: int | None = None  # token embedded in the mask slots (None: a learned vector, the old layout)
    steps: int = 600  # optimiser steps
    batch_seqs: int = 12  # sequences per step
    anchors_per_seq: int = 6  # blocks per sequence per step
    lr: float = 2e-3  # peak AdamW learning rate (cosine decay, linear warm-up)
    warmup: int = 30  # warm-up steps
    weight_decay: float = 0.01  # AdamW weight decay
    seed: int = 0  # everything random derives from this
    checkpoint_every: int = 100  # steps between resumable checkpoints
    prompt_anchors: bool = False  # anchors inside the prompt too: the target's p_t is known there, so the prompt
    # text is more distillation data for free (the paper anchors in target-generated text only)
    loss: LossWeights = field(default_factory=LossWeights)  # loss term weights


@dataclass
class TrainData:
    """Sequences = prompt + target-generated continuation; anchors only at p >= prompt_len - 1.

    With `hidden` / `top_probs` / `top_ids` set (see `cache_target`), training reads the frozen target's
    outputs from memory instead of running the target every step; p_t is then its top-K, renormalised.
    """

    tokens: torch.Tensor  # [S, T] long
    prompt_len: int  # tokens of prompt at the start of every row
    hidden: torch.Tensor | None = None  # [S, T, W] fp16: target hidden states of `layers`
    top_probs: torch.Tensor | None = None  # [S, T, K] fp16: target top-K probabilities (renormalised)
    top_ids: torch.Tensor | None = None  # [S, T, K] int32: their token ids
    layers: tuple[int, ...] = ()  # target layers in `hidden`


@torch.no_grad()
def cache_target(target: LeanModel, data: TrainData, layers: tuple[int, ...], k: int = 64, batch: int = 32,
                 on_batch: Callable[[int], None] | None = None) -> TrainData:
    """Run the frozen target once over every sequence; keep hidden states (fp16) and top-K p_t."""
    hs, ps, ids = [], [], []
    for start in range(0, data.tokens.shape[0], batch):
        rows = data.tokens[start:start + batch].to(target.device)
        logits, hidden = target.forward_full(rows, hidden_layers=layers)
        top = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
        ps.append((top.values / top.values.sum(-1, keepdim=True)).half().cpu())
        ids.append(top.indices.int().cpu())
        hs.append(hidden.half().cpu())  # type: ignore[union-attr]
        if on_batch:
            on_batch(rows.shape[0])
    return TrainData(tokens=data.tokens, prompt_len=data.prompt_len, hidden=torch.cat(hs), top_probs=torch.cat(ps),
                     top_ids=torch.cat(ids), layers=tuple(layers))


def set_lr(opt: torch.optim.Optimizer, peak: float, step: int, steps: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 0 at `steps`; sets and returns the rate."""
    lr = peak * min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * step / steps))
    for group in opt.param_groups:
        group["lr"] = lr
    return lr


def position_weights(gamma: int) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma), k = 1..gamma -> [gamma]."""
    return torch.exp(-torch.arange(gamma, dtype=torch.float32) / gamma)


def sample_anchors(n: int, a: int, lo: int, hi: int, gen: torch.Generator) -> torch.Tensor:
    """[n, a] anchor positions uniform in [lo, hi] (inclusive)."""
    return torch.randint(lo, hi + 1, (n, a), generator=gen)


def drafter_loss(model: DSparkDraftModel, tokens: torch.Tensor, target_logits: torch.Tensor | None,
                 target_hidden: torch.Tensor, anchors: torch.Tensor, weights: LossWeights,
                 top: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The training objective on a batch; tokens [N, T], target_logits [N, T, V] (or `top` = target top-K
    (probs, ids) [N, T, K] each), hidden [N, T, W], anchors [N, A] with p + gamma <= T - 1.
    Returns the loss and its terms (for logging)."""
    g = model.cfg.block_size
    block = model.forward_packed(tokens, target_hidden, anchors)
    idx = anchors[:, :, None] + torch.arange(g, device=tokens.device)[None, None]  # [N, A, G]: x_{k-1} positions
    n, a = anchors.shape
    prev = tokens.gather(1, idx.reshape(n, -1)).view(n, a, g)  # x_0 = anchor, then true tokens
    truth = tokens.gather(1, (idx + 1).reshape(n, -1)).view(n, a, g)  # x*_k
    logits, conf = model.teacher_forced(block, prev)  # [N, A, G, V], [N, A, G]
    logp_d = torch.log_softmax(logits.float(), dim=-1)
    if top is None:
        assert target_logits is not None
        v = logits.shape[-1]
        p_t = torch.softmax(target_logits.float(), dim=-1).gather(
            1, idx.reshape(n, -1, 1).expand(-1, -1, v)).view(n, a, g, v)  # target at the same positions
        l1 = (logp_d.exp() - p_t).abs().sum(-1)  # [N, A, G]
        kl = (p_t * (p_t.clamp(min=1e-8).log() - logp_d)).sum(-1)
    else:  # p_t = 0 outside its top-K: |p_d - p_t| summed there is the draft mass left over
        kk = top[0].shape[-1]
        vals = top[0].float().gather(1, idx.reshape(n, -1, 1).expand(-1, -1, kk)).view(n, a, g, kk)
        ids = top[1].long().gather(1, idx.reshape(n, -1, 1).expand(-1, -1, kk)).view(n, a, g, kk)
        pd_top = logp_d.gather(-1, ids).exp()
        l1 = (pd_top - vals).abs().sum(-1) + (1.0 - pd_top.sum(-1)).clamp(min=0.0)
        kl = (vals * (vals.clamp(min=1e-8).log() - logp_d.gather(-1, ids))).sum(-1)
    ce = -logp_d.gather(-1, truth[..., None]).squeeze(-1)
    label = (1.0 - 0.5 * l1).detach().clamp(0.0, 1.0)
    bce = F.binary_cross_entropy_with_logits(conf.float(), label, reduction="none")
    w = position_weights(g).to(logits.device)
    terms = {name: (t * w).sum(-1).mean() for name, t in (("ce", ce), ("tv", l1), ("conf", bce), ("kl", kl))}
    loss = (weights.ce * terms["ce"] + weights.tv * terms["tv"] + weights.conf * terms["conf"]
            + weights.kl * terms["kl"])
    stats = {k: float(t.detach()) for k, t in terms.items()}
    stats["accept"] = float((1.0 - 0.5 * l1.detach()).mean())  # mean per-position acceptance 1 - TV (teacher-forced)
    return loss, stats


@torch.no_grad()
def generate_continuations(target: LeanModel, prompts: torch.Tensor, new_tokens: int, *, temperature: float,
                           greedy_rows: int, seed: int) -> torch.Tensor:
    """prompts [S, P] -> [S, P + new_tokens]: the first `greedy_rows` rows greedy, the rest sampled."""
    s, p = prompts.shape
    cache = target.new_cache(s, p + new_tokens + 1)
    gen = torch.Generator().manual_seed(seed)
    logits = target(prompts, cache, list(range(s)), last_only=True).logits[:, 0]  # [S, V]
    out = [prompts]
    for _ in range(new_tokens):
        nxt = logits.argmax(-1)
        if greedy_rows < s:
            probs = torch.softmax(logits[greedy_rows:].float().cpu() / max(temperature, 1e-4), -1)
            nxt[greedy_rows:] = torch.multinomial(probs, 1, generator=gen).squeeze(-1).to(nxt.device)
        out.append(nxt[:, None].cpu())
        logits = target(nxt[:, None], cache, list(range(s))).logits[:, 0]
    return torch.cat(out, dim=1)


def _save_atomic(obj: object, path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def load_state(path: Path, mmap: bool = False) -> dict:
    """A training state or data cache this tool wrote (tensors, numbers, dicts, TrainData), read without running
    any code a hostile file could carry (torch's weights_only unpickler); anything else is one line. `mmap`: the
    tensors stay in the file, read only where touched (a reader of the data cache's tokens skips its GBs of states)."""
    try:
        with torch.serialization.safe_globals([TrainData]):
            state = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as e:  # noqa: BLE001 - pickle and zip errors of every kind: the file is not ours
        raise DSparkError(f"{path}: not a training state this tool wrote ({type(e).__name__}); delete it or pass "
                          "--fresh / another --state-dir") from None
    if not isinstance(state, dict):
        raise DSparkError(f"{path}: not a training state this tool wrote; delete it or pass --fresh")
    return state


def build_model(cfg: TrainConfig, target: LeanModel) -> DSparkDraftModel:
    """A fresh drafter for `target` sized by `cfg`."""
    dcfg = draft_config(cfg, target)
    torch.manual_seed(cfg.seed)
    return DSparkDraftModel(dcfg, target.embed, target.lm_head).to(target.device)


SHAPE_KEYS = ("head", "block_size", "num_layers", "markov_rank", "intermediate_size", "target_layers",
              "mask_token_id", "vocab_size", "hidden_size")  # what makes one drafter's weights fit another's


def shape_diff(a: DraftConfig, b: DraftConfig) -> list[str]:
    """`key a / b` for each SHAPE_KEYS field the two drafter configs differ in."""
    return [f"{k} {getattr(a, k)} / {getattr(b, k)}" for k in SHAPE_KEYS if getattr(a, k) != getattr(b, k)]


def draft_config(cfg: TrainConfig, target: LeanModel) -> DraftConfig:
    """The architecture `cfg` trains for `target`."""
    over: dict[str, object] = dict(head=cfg.head, block_size=cfg.block_size, num_layers=cfg.num_layers,
                                   markov_rank=cfg.markov_rank)
    if cfg.intermediate_size:
        over["intermediate_size"] = cfg.intermediate_size
    if cfg.target_layers:
        over["target_layers"] = list(cfg.target_layers)
    if cfg.mask_token_id is not None:
        over["mask_token_id"] = cfg.mask_token_id
    return DraftConfig.for_target(target.arch, **over)


@dataclass
class WarmStart:
    """A committed drafter's weights that a new training run starts from (`train-drafter --init-from`)."""

    state: dict[str, torch.Tensor]  # its parameters, in the training model's names (fp32)
    source: dict[str, Any]  # what it was: folder name, steps, trained_at, the data it trained on (config.json)


def warm_start(folder: Path, target: LeanModel, cfg: TrainConfig) -> WarmStart:
    """The drafter in `folder` as the start of a new run of `cfg`; one line where its shape is not `cfg`'s."""
    from dspark_core.drafters.dspark_layout import load_drafter

    got = load_drafter(folder, target)
    diff = shape_diff(got.cfg, draft_config(cfg, target))
    if diff:
        raise DSparkError(f"--init-from {folder}: a drafter of another shape ({', '.join(diff)}: its / this run's); "
                          "pass the options it was trained with")
    extra = got.cfg.extra or {}
    trained = extra.get("train") or {}
    source = {"drafter": Path(folder).name, "steps": trained.get("steps"), "trained_at": extra.get("trained_at"),
              "data": extra.get("data", [])}
    return WarmStart({k: v.float() for k, v in got.state_dict().items()}, source)


def train_drafter(target: LeanModel, data: TrainData, cfg: TrainConfig, out: Path,
                  on_step: Callable[[int, dict[str, float]], None] | None = None,
                  state_dir: Path | None = None, deadline: float | None = None,
                  on_eval: Callable[[int, DSparkDraftModel], None] | None = None,
                  eval_every: int = 0, data_recipe: dict[str, Any] | None = None,
                  init: WarmStart | None = None) -> DSparkDraftModel:
    """Train (or resume) a drafter; the final drafter (fp16) goes to `out`, resumable checkpoints to
    `state_dir` (default `out`). With `deadline` (a time.time() value) training stops after the step that
    crosses it, checkpoints, and saves the drafter as it is (a rerun continues the schedule). `on_eval(step,
    model)` runs every `eval_every` steps (the model in eval mode): the training curve. `data_recipe`: how `data`
    was made; the checkpoint keeps one entry per recipe trained on, from the step it began (a resumed run may
    train on other data), and the drafter's config.json records them. `init`: weights to start from where no
    checkpoint is (a new schedule from step 0); the checkpoint and config.json record what they were."""
    out.mkdir(parents=True, exist_ok=True)
    state_dir = state_dir or out
    state_dir.mkdir(parents=True, exist_ok=True)
    for p in target.parameters():
        p.requires_grad_(False)
    model = build_model(cfg, target)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    start = 0
    legs: list[dict[str, Any]] = []  # {"from_step", "recipe"} per data recipe trained on, in order
    gen = torch.Generator().manual_seed(cfg.seed)
    state_path = state_dir / STATE_FILE
    if state_path.is_file():
        state = load_state(state_path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        legs = list(state.get("data_legs", []))
        gen.set_state(state["generator"])
        origin = state.get("init_from")
    elif init is not None:
        model.load_state_dict(init.state)
        origin = init.source
    else:
        origin = None
    if data_recipe is not None and (not legs or legs[-1]["recipe"] != data_recipe):
        legs.append({"from_step": start, "recipe": data_recipe})
    g = cfg.block_size
    n_seq, t = data.tokens.shape
    lo, hi = 1 if cfg.prompt_anchors else max(1, data.prompt_len - 1), t - 1 - g
    if hi < lo:
        raise ValueError(f"sequences of {t} tokens are too short for blocks of {g} after a {data.prompt_len}-token "
                         "prompt; generate longer continuations")
    layers = tuple(model.cfg.target_layers)
    cached = data.hidden is not None and data.top_probs is not None and data.top_ids is not None
    if cached and data.layers != layers:
        raise ValueError(f"cached target states are of layers {data.layers}, the drafter reads {layers}")
    model.train()
    for step in range(start, cfg.steps):
        lr = set_lr(opt, cfg.lr, step, cfg.steps, cfg.warmup)
        rows = torch.randint(0, n_seq, (cfg.batch_seqs,), generator=gen)
        tokens = data.tokens[rows].to(target.device)
        top = None
        if cached:
            t_logits, t_hidden = None, data.hidden[rows].to(target.device)  # type: ignore[index]
            top = (data.top_probs[rows].to(target.device), data.top_ids[rows].to(target.device))  # type: ignore[index]
        else:
            with torch.no_grad():
                t_logits, t_hidden = target.forward_full(tokens, hidden_layers=layers)
        anchors = sample_anchors(cfg.batch_seqs, cfg.anchors_per_seq, lo, hi, gen).to(target.device)
        loss, stats = drafter_loss(model, tokens, t_logits, t_hidden, anchors, cfg.loss, top)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        stats["loss"], stats["lr"] = float(loss.detach()), lr
        if on_step:
            on_step(step + 1, stats)
        late = deadline is not None and time.time() > deadline
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps or late:
            _save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                          "generator": gen.get_state(), "config": asdict(cfg), "data_legs": legs,
                          **({"init_from": origin} if origin else {})}, state_path)
        if on_eval and eval_every and (step + 1) % eval_every == 0:
            model.eval()
            on_eval(step + 1, model)
            model.train()
        if late:
            break
    model.eval()
    model.cfg.extra.update({"train": asdict(cfg), "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    if legs:
        model.cfg.extra["data"] = legs
    if origin:
        model.cfg.extra["init_from"] = origin
    save_drafter(model, out, target_layers=target.arch.num_hidden_layers,
                 max_positions=target.arch.max_position_embeddings)
    return model


@torch.no_grad()
def evaluate_acceptance(model: DSparkDraftModel, target: LeanModel, data: TrainData, *, anchors_per_seq: int = 8,
                        seed: int = 1) -> list[float]:
    """Teacher-forced per-position greedy acceptance on `data`: P(draft argmax == target argmax at k |
    the true prefix), averaged over random anchors. A quick check; the engine's bench is the real measure."""
    g = model.cfg.block_size
    gen = torch.Generator().manual_seed(seed)
    n, t = data.tokens.shape
    lo, hi = max(1, data.prompt_len - 1), t - 1 - g
    hits = torch.zeros(g)
    total = 0
    for start in range(0, n, 16):
        tokens = data.tokens[start:start + 16].to(target.device)
        t_logits, t_hidden = target.forward_full(tokens, hidden_layers=tuple(model.cfg.target_layers))
        anchors = sample_anchors(tokens.shape[0], anchors_per_seq, lo, hi, gen).to(target.device)
        block = model.forward_packed(tokens, t_hidden, anchors)
        idx = anchors[:, :, None] + torch.arange(g, device=tokens.device)[None, None]
        b, a = anchors.shape
        prev = tokens.gather(1, idx.reshape(b, -1)).view(b, a, g)
        logits, _ = model.teacher_forced(block, prev)
        best_t = t_logits.argmax(-1).gather(1, idx.reshape(b, -1)).view(b, a, g)
        hits += (logits.argmax(-1) == best_t).float().sum(dim=(0, 1)).cpu()
        total += b * a
    return (hits / max(total, 1)).tolist()
