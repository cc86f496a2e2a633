"""Build the reference tiny models: BPE tokenizer + Qwen3-architecture target + small AR draft model.

Trained here, deterministically, on the Python standard library's `.py` sources only (site-packages and
every other installed package stay out: they are the held-out evaluation material). Saved in Hugging Face
format so the same loader serves the tiny models and real checkpoints.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.tokenizer import EOS_TOKEN

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress

    from dspark_core.modeling.model import LeanModel

VOCAB = 4096  # BPE vocabulary of the reference tokenizer


def stdlib_sources() -> list[Path]:
    """Sorted `.py` files of the standard library, excluding site-packages / dist-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def is_heldout(path: Path) -> bool:
    """2 % of the files (by a hash of the relative path) are the held-out split for the reported loss."""
    return hashlib.sha1(path.name.encode()).digest()[0] < 6


def target_arch() -> ArchConfig:
    """The tiny target: Qwen3 architecture, ~2.4 M parameters, tied embeddings."""
    return ArchConfig(model_type="qwen3", vocab_size=VOCAB, hidden_size=192, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, head_dim=32,
                      rope_theta=10000.0, tie_word_embeddings=True, qk_norm=True,
                      max_position_embeddings=2048, eos_token_id=0, bos_token_id=0)


def draft_arch() -> ArchConfig:
    """The small autoregressive draft: same tokenizer, one Qwen3 layer, ~0.7 M parameters."""
    return ArchConfig(model_type="qwen3", vocab_size=VOCAB, hidden_size=128, intermediate_size=384,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      rope_theta=10000.0, tie_word_embeddings=True, qk_norm=True,
                      max_position_embeddings=2048, eos_token_id=0, bos_token_id=0)


def train_tokenizer(texts: list[str], out: Path) -> Path:
    """Byte-level BPE with `<|endoftext|>` as id 0; writes `out` (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


def encode_corpus(tok_file: Path, texts: list[str]) -> torch.Tensor:
    """All texts tokenised and joined by EOS -> [N] long."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_file))
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(0)
    return torch.tensor(ids, dtype=torch.long)


@dataclass
class TrainSpec:
    """Hyper-parameters of one language-model training run."""

    steps: int  # optimizer steps
    batch: int = 8  # sequences per step
    seq: int = 256  # tokens per sequence
    lr: float = 3e-3  # peak learning rate (cosine decay, linear warm-up)
    warmup: int = 50  # warm-up steps


def batches(data: torch.Tensor, spec: TrainSpec, gen: torch.Generator) -> torch.Tensor:
    """[batch, seq + 1] random windows of `data`."""
    import torch

    starts = torch.randint(0, data.numel() - spec.seq - 1, (spec.batch,), generator=gen)
    return torch.stack([data[s : s + spec.seq + 1] for s in starts.tolist()])


def heldout_loss(model: LeanModel, data: torch.Tensor, seq: int = 256, max_windows: int = 64) -> float:
    """Mean next-token cross-entropy (nats) over contiguous windows of the held-out split."""
    import torch
    import torch.nn.functional as F

    n = min(max_windows, (data.numel() - 1) // seq)
    x = data[: n * seq + 1]
    inp = x[:-1].view(n, seq)
    tgt = x[1:].reshape(n, seq)
    model.eval()
    with torch.no_grad():
        total = 0.0
        for i in range(0, n, 16):
            logits, _ = model.forward_full(inp[i : i + 16])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[i : i + 16].reshape(-1),
                                     reduction="sum").item()
    model.train()
    return total / (n * seq)


def _set_lr(opt, spec: TrainSpec, step: int) -> None:  # opt: torch.optim.Optimizer
    """Linear warm-up, cosine decay, floored at 2 % of the peak."""
    lr = spec.lr * min(1.0, (step + 1) / spec.warmup) * 0.5 * (1 + math.cos(math.pi * step / spec.steps))
    for g in opt.param_groups:
        g["lr"] = max(lr, spec.lr * 0.02)


def train_lm(arch: ArchConfig, data: torch.Tensor, spec: TrainSpec, seed: int, progress: Progress,
             label: str) -> LeanModel:
    """Train a LeanModel of `arch` on random windows of `data` (AdamW, cosine schedule)."""
    import torch
    import torch.nn.functional as F

    from dspark_core.modeling.model import LeanModel

    torch.manual_seed(seed)
    model = LeanModel(arch)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02 if "down" not in name and ".o." not in name
                                  else 0.02 / math.sqrt(2 * arch.num_hidden_layers))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    task = progress.add_task(label, total=spec.steps, loss=float("nan"))
    ema = float("nan")
    for step in range(spec.steps):
        _set_lr(opt, spec, step)
        xb = batches(data, spec, gen)
        logits, _ = model.forward_full(xb[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if math.isnan(ema) else 0.95 * ema + 0.05 * loss.item()
        progress.update(task, advance=1, loss=ema)
        if not progress.console.is_terminal and (step + 1) % 100 == 0:  # a visible trail in logs too
            progress.console.print(f"{label}: step {step + 1}/{spec.steps} loss {ema:.3f}")
    model.eval()
    return model


def distill_lm(student: LeanModel, teacher: LeanModel, data: torch.Tensor, spec: TrainSpec, seed: int,
               progress: Progress, label: str) -> LeanModel:
    """Fine-tune `student` towards `teacher`'s next-token distributions (KL(p_teacher || p_student)).

    This is what makes a small draft model agree with the target (acceptance), not just model the text.
    """
    import torch
    import torch.nn.functional as F

    student.train()
    teacher.eval()
    opt = torch.optim.AdamW(student.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    task = progress.add_task(label, total=spec.steps, loss=float("nan"))
    ema = float("nan")
    for step in range(spec.steps):
        _set_lr(opt, spec, step)
        xb = batches(data, spec, gen)[:, :-1]
        with torch.no_grad():
            p_t = torch.log_softmax(teacher.forward_full(xb)[0].float(), -1)  # [B, T, V]
        logq = torch.log_softmax(student.forward_full(xb)[0], -1)
        loss = F.kl_div(logq.reshape(-1, logq.shape[-1]), p_t.reshape(-1, p_t.shape[-1]), log_target=True,
                        reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        ema = loss.item() if math.isnan(ema) else 0.95 * ema + 0.05 * loss.item()
        progress.update(task, advance=1, loss=ema)
        if not progress.console.is_terminal and (step + 1) % 100 == 0:
            progress.console.print(f"{label}: step {step + 1}/{spec.steps} kl {ema:.3f}")
    student.eval()
    return student


def greedy_agreement(a: LeanModel, b: LeanModel, data: torch.Tensor, seq: int = 256, windows: int = 16) -> float:
    """Fraction of held-out positions where the two models' argmax tokens agree (draft acceptance proxy)."""
    import torch

    x = data[: windows * seq].view(windows, seq)
    with torch.no_grad():
        return float((a.forward_full(x)[0].argmax(-1) == b.forward_full(x)[0].argmax(-1)).float().mean())


@dataclass
class BuildReport:
    """What build-tiny produced (printed by the CLI, JSON with --json)."""

    out: str  # folder holding target/ and draft/
    files: int  # stdlib source files used
    train_tokens: int  # tokens in the training split
    heldout_tokens: int  # tokens in the held-out split
    target_params: int  # parameters of the target
    draft_params: int  # parameters of the draft model
    target_heldout_loss: float  # nats/token on held-out stdlib files
    draft_heldout_loss: float  # nats/token on held-out stdlib files
    draft_agreement: float  # held-out positions where draft and target argmax agree
    seconds: float  # wall time of the build


def build_tiny(out: Path, target_steps: int = 900, draft_steps: int = 500, kd_steps: int = 400, seed: int = 0,
               threads: int = 1) -> BuildReport:
    """Train tokenizer, target and draft; write `out/target` and `out/draft` in HF format."""
    import tempfile

    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dspark_core.modeling.checkpoint import check_replaceable, save_model

    for name in ("target", "draft"):  # before minutes of training, not after
        check_replaceable(out / name)
    t0 = time.time()
    torch.set_num_threads(threads)
    files = stdlib_sources()
    texts_train, texts_held = [], []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        (texts_held if is_heldout(f) else texts_train).append(text)
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())
    with tempfile.TemporaryDirectory() as tmp, Progress(*cols) as progress:
        prep = progress.add_task("tokenizer + corpus", total=2, loss=float("nan"))
        tok_file = train_tokenizer(texts_train, Path(tmp) / "tokenizer.json")
        progress.update(prep, advance=1)
        train = encode_corpus(tok_file, texts_train)
        held = encode_corpus(tok_file, texts_held)
        progress.update(prep, advance=1)
        target = train_lm(target_arch(), train, TrainSpec(steps=target_steps), seed, progress, "target")
        draft = train_lm(draft_arch(), train, TrainSpec(steps=draft_steps, lr=4e-3), seed + 1, progress, "draft")
        draft = distill_lm(draft, target, train, TrainSpec(steps=kd_steps, lr=2e-3), seed + 2, progress, "draft kd")
        t_loss, d_loss = heldout_loss(target, held), heldout_loss(draft, held)
        save_model(target, out / "target", dtype="bf16", tokenizer_file=tok_file)
        save_model(draft, out / "draft", dtype="bf16", tokenizer_file=tok_file)
    return BuildReport(out=str(out), files=len(files), train_tokens=int(train.numel()),
                       heldout_tokens=int(held.numel()), target_params=target.arch.num_params(),
                       draft_params=draft.arch.num_params(), target_heldout_loss=round(t_loss, 4),
                       draft_heldout_loss=round(d_loss, 4),
                       draft_agreement=round(greedy_agreement(draft, target, held), 4),
                       seconds=round(time.time() - t0, 1))
