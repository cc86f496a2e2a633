"""A small autoregressive draft model for a pretrained target, for the peers' draft-model speculation
(transformers' assisted generation, vLLM's `draft_model`, our `ar_draft`), which needs a standalone causal LM with
the target's tokenizer.

Why this shape: the target's vocabulary (49,152 rows for SmolLM2) makes any draft model's embedding the bulk of its
weights, so the draft shares the target's embedding and tied LM head and owns only its decoder layers: the target
cut to its first `layers` layers, each MLP narrowed to the `intermediate` channels with the largest weight norms,
then distilled towards the target on the same target-generated data the DSpark drafters train on (the cached top-K
p_t, cross-entropy to it = KL up to a constant). What is committed is the draft without the shared embedding
(`slim_tensors`); `assemble` adds the target's embedding back into a full Hugging Face folder in the user cache.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dspark_core.atomic import atomic_write, replace_dir
from dspark_core.errors import DSparkError
from dspark_core.training.train import load_state, set_lr

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel
    from dspark_core.training.train import TrainData

EMBED = "model.embed_tokens.weight"  # the shared embedding, left out of the committed draft
SHARED = (EMBED, "lm_head.weight")  # tensors the draft takes from the target (lm_head: untied targets only)
STATE_FILE = "ar_state.pt"  # resumable distillation state
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


@dataclasses.dataclass
class ARSpec:
    """What `train-ar-draft` does."""

    layers: int = 1  # decoder layers kept from the target (its first ones)
    intermediate: int = 768  # MLP channels kept per layer
    steps: int = 800  # optimiser steps
    batch_seqs: int = 8  # sequences per step
    positions: int = 64  # positions per sequence that get logits and loss (the LM head dominates the cost)
    lr: float = 1e-3  # peak AdamW learning rate (linear warm-up, cosine decay)
    warmup: int = 30  # warm-up steps
    seed: int = 0  # data order
    checkpoint_every: int = 100  # steps between resumable checkpoints


def cut_target(target: LeanModel, spec: ARSpec) -> LeanModel:
    """The target's first `spec.layers` layers with narrowed MLPs, its final norm and its embedding (fp32, the
    embedding frozen)."""
    from dspark_core.modeling.model import LeanModel

    a = target.arch
    if not 1 <= spec.layers < a.num_hidden_layers or not 1 <= spec.intermediate <= a.intermediate_size:
        raise DSparkError(f"an AR draft needs 1 <= layers < {a.num_hidden_layers} and 1 <= intermediate <= "
                          f"{a.intermediate_size}; got {spec.layers} and {spec.intermediate}")
    arch = dataclasses.replace(a, num_hidden_layers=spec.layers, intermediate_size=spec.intermediate,
                               extra=dict(a.extra))
    student = LeanModel(arch)
    with torch.no_grad():
        student.embed.weight.copy_(target.embed.weight.float())
        if not arch.tie_word_embeddings:
            student.lm_head.weight.copy_(target.lm_head.weight.float())
        student.norm.weight.copy_(target.norm.weight.float())
        for mine, theirs in zip(student.layers, target.layers, strict=False):
            sd = {k: v.float() for k, v in theirs.state_dict().items()}
            gate, up = sd["gate_up.weight"].chunk(2)  # [I, H] each
            keep = (up.norm(dim=1) * sd["down.weight"].norm(dim=0)).topk(spec.intermediate).indices.sort().values
            sd["gate_up.weight"] = torch.cat([gate[keep], up[keep]])
            sd["down.weight"] = sd["down.weight"][:, keep]
            mine.load_state_dict(sd)
    student.embed.weight.requires_grad_(False)
    student.lm_head.weight.requires_grad_(False)
    return student


def _logits_at(model: LeanModel, tokens: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Causal forward over tokens [B, T]; logits only at positions idx [B, P] -> [B, P, V] float32."""
    b, t = tokens.shape
    cos, sin = model._rope(torch.arange(t)[None].expand(b, t))
    x = model.embed(tokens)
    for layer in model.layers:
        x = layer(x, cos, sin, None, None, None, None)
    x = x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))
    return model.lm_head(model.norm(x)).float()


def distill(student: LeanModel, data: TrainData, spec: ARSpec, state_dir: Path,
            on_step: Callable[[int, float], None] | None = None, deadline: float | None = None) -> LeanModel:
    """Minimise the cross-entropy to the target's cached top-K p_t (resumes from state_dir/ar_state.pt)."""
    if data.top_probs is None or data.top_ids is None:
        raise DSparkError("the training data has no cached target distributions; rebuild it with train-drafter")
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed)
    start = 0
    state_path = state_dir / STATE_FILE
    if state_path.is_file():
        state = load_state(state_path)
        student.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        start = int(state["step"])
    n, t = data.tokens.shape
    p = min(spec.positions, t)
    student.train()
    for step in range(start, spec.steps):
        set_lr(opt, spec.lr, step, spec.steps, spec.warmup)
        rows = torch.randint(0, n, (spec.batch_seqs,), generator=gen)
        idx = torch.rand(spec.batch_seqs, t, generator=gen).argsort(dim=1)[:, :p]  # [B, P] distinct positions
        logq = torch.log_softmax(_logits_at(student, data.tokens[rows], idx), dim=-1)  # [B, P, V]
        k = data.top_probs.shape[-1]
        pt = data.top_probs[rows].gather(1, idx[..., None].expand(-1, -1, k)).float()  # [B, P, K]
        ids = data.top_ids[rows].gather(1, idx[..., None].expand(-1, -1, k)).long()
        loss = -(pt * logq.gather(-1, ids)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if on_step:
            on_step(step + 1, float(loss.detach()))
        late = deadline is not None and time.time() > deadline
        if (step + 1) % spec.checkpoint_every == 0 or step + 1 == spec.steps or late:
            state = {"model": student.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                     "generator": gen.get_state()}
            atomic_write(state_path, lambda tmp, state=state: torch.save(state, tmp))
        if late:
            break
    return student.eval()


def save_slim(student: LeanModel, folder: Path, spec: ARSpec) -> Path:
    """The committed draft: config.json + model.safetensors (bf16) without the shared embedding / LM head."""
    from safetensors.torch import save_file

    from dspark_core.modeling.checkpoint import hf_state_dict

    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in hf_state_dict(student).items()
               if k not in SHARED}
    cfg = student.arch.to_hf_dict() | {"torch_dtype": "bfloat16",
                                       "dspark_ar_draft": {"shared_embedding": EMBED, **dataclasses.asdict(spec)}}
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "model.safetensors", lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    atomic_write(folder / "config.json", lambda p: Path(p).write_text(json.dumps(cfg, indent=2) + "\n"))
    return folder


def assemble(slim: Path, target: Path, out: Path) -> Path:
    """A full Hugging Face folder at `out`: the slim draft's tensors + the target's embedding + its tokenizer files,
    swapped in atomically; an existing `out` is replaced only when it is one of ours."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    cfg = json.loads((slim / "config.json").read_text())
    if "dspark_ar_draft" not in cfg:
        raise DSparkError(f"{slim} is not a slim AR draft (config.json lacks dspark_ar_draft)")
    if out.exists() and not (out / ".dspark-ar-draft").is_file():
        raise DSparkError(f"{out} exists and was not written by dspark-tune; move it away")
    tensors = load_file(str(slim / "model.safetensors"))
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        for name in SHARED:
            if name in f.keys():
                tensors[name] = f.get_tensor(name).to(torch.bfloat16)

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for name in TOKENIZER_FILES:
            if (target / name).is_file():
                shutil.copy(target / name, tmp / name)
        marker = {"slim": str(slim), "target": str(target), "sha256": _sha256(slim / "model.safetensors")}
        (tmp / ".dspark-ar-draft").write_text(json.dumps(marker) + "\n")

    return replace_dir(out, fill)


@torch.no_grad()
def greedy_agreement(student: LeanModel, target: LeanModel, data: TrainData) -> float:
    """Share of the continuation positions of (held-out) sequences where the draft's argmax is the target's."""
    toks = data.tokens.to(target.device)
    idx = torch.arange(toks.shape[1])[None].expand(toks.shape[0], -1)
    mine = _logits_at(student, toks, idx).argmax(-1)
    theirs = target.forward_full(toks)[0].argmax(-1)
    return float((mine == theirs).float()[:, data.prompt_len - 1:].mean())


def draft_cache(name: str) -> Path:
    """Where the assembled (full) AR draft of fetched model `name` lives."""
    from dspark_core.modeling.models_fetch import models_dir

    return models_dir() / f"{name}-draft"


def ensure_draft(name: str, target: Path) -> Path | None:
    """The assembled AR draft of fetched model `name` (assembled from the committed slim draft when missing or
    older than it), or None when none is committed."""
    from dspark_core.paths import MODEL_ASSETS

    slim = MODEL_ASSETS / name / "draft"
    if not (slim / "model.safetensors").is_file():
        return None
    out = draft_cache(name)
    try:
        made = json.loads((out / ".dspark-ar-draft").read_text())
    except (OSError, ValueError):
        made = {}
    if made.get("sha256") != _sha256(slim / "model.safetensors") or not (out / "model.safetensors").is_file():
        assemble(slim, target, out)
    return out


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
