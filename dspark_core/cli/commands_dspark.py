"""CLI commands of DSpark part 2: `train-drafter` and `calibrate` (registered by cli.py via `register`).

Heavy imports (torch, rich.progress) happen inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from dspark_core.atomic import atomic_write
from dspark_core.config import ASSETS, committed_assets
from dspark_core.errors import DSparkError

HEADS = ("none", "markov", "rnn")


def register(app: typer.Typer) -> None:
    """Add `train-drafter`, `average-drafters` and `calibrate` to the root app."""
    app.command("train-drafter")(train_drafter_cmd)
    app.command("average-drafters")(average_drafters_cmd)
    app.command("calibrate")(calibrate_cmd)


def _emit(obj: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(obj, indent=2) + "\n")
    else:
        from rich.console import Console

        console = Console()
        for line in lines:
            console.print(line)


def _trail(progress: Any, what: str, total: int) -> Any:
    """A progress task of `total` rows and its callback (rows done since the last call); where the bar is not drawn
    (logs), it prints about eight lines with the minutes left, the last at `total`."""
    task = progress.add_task(what, total=total, loss=float("nan"), acc=float("nan"))
    started, done = time.time(), [0]

    def advance(n: int) -> None:
        progress.update(task, advance=n)
        done[0] += n
        if not progress.console.is_terminal and (done[0] * 8 // total > (done[0] - n) * 8 // total
                                                 or done[0] == total):
            left = (time.time() - started) / done[0] * (total - done[0])
            progress.console.print(f"{what}: {done[0]}/{total} rows, about {left / 60:.0f} min left")
    return advance


def _load_target(path: Path, device: str, dtype: str = "fp32") -> Any:
    import torch

    from dspark_core.modeling.checkpoint import load_model

    if dtype not in ("fp32", "bf16"):
        raise DSparkError(f"--dtype {dtype!r} is not one of fp32, bf16")
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return load_model(path, device, dtype)


def target_data(*args: Any, **kwargs: Any) -> Any:
    """`training.target_data.target_data`, imported on use (it imports torch)."""
    from dspark_core.training.target_data import target_data as build

    return build(*args, **kwargs)


def train_root(target: Path) -> Path:
    """Where training state for a target lives in the user cache: the shared data file and one folder per head
    (`tiny` for the tiny target, else the checkpoint folder's name)."""
    from dspark_core.modeling.models_fetch import models_dir

    key = "tiny" if committed_assets(str(target)) == ASSETS else target.name
    return models_dir().parent / "train-drafter" / key


MASK_TOKENS = ("<|MASK|>", "<|mask|>", "<mask>", "[MASK]")  # spellings of a dedicated mask token


def default_mask_token(target: Path) -> int:
    """The id the mask slots embed: the tokenizer's dedicated mask token when it has one (SGLang's default
    spelling `<|MASK|>` first), else its end-of-text token, which never occurs inside a drafted block."""
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from dspark_core.modeling.tokenizer import EOS_TOKEN, Tokenizer

    tok = Tokenizer.load(checkpoint_folder(target))
    for name in (*MASK_TOKENS, EOS_TOKEN):
        tid = tok.tok.token_to_id(name)
        if tid is not None:
            return int(tid)
    if tok.eos_ids:
        return int(tok.eos_ids[0])
    raise DSparkError(f"the tokenizer of {target} has no mask or end-of-text token; pass --mask-token-id")


def train_drafter_cmd(
    head: Annotated[str, typer.Option(help="Sequential head: none (DFlash-style), markov or rnn.")] = "markov",
    out: Annotated[Path | None, typer.Option(help="Output folder (default: the committed drafter for --head of the "
                                             "tiny target or of a fetched model).")] = None,
    target: Annotated[str, typer.Option(help="Target checkpoint: a folder (HF format) or a fetched model "
                                         "(smollm2-135m).")] = str(ASSETS / "target"),
    steps: Annotated[int, typer.Option(min=1, help="Optimiser steps.")] = 600,
    block_size: Annotated[int, typer.Option(min=1, max=16, help="Block length gamma trained for.")] = 16,
    layers: Annotated[int, typer.Option(min=1, max=8, help="Draft transformer layers.")] = 2,
    intermediate_size: Annotated[int, typer.Option(min=0, help="SwiGLU width of the draft layers (0 = the "
                                                   "target's).")] = 0,
    rank: Annotated[int, typer.Option(min=4, help="Markov rank r (W1 / W2 width).")] = 64,
    batch_seqs: Annotated[int, typer.Option(min=1, help="Sequences per step.")] = 8,
    anchors: Annotated[int, typer.Option(min=1, help="Random anchors (blocks) per sequence per step.")] = 4,
    lr: Annotated[float, typer.Option(min=0.0, help="Peak learning rate.")] = 2e-3,
    sequences: Annotated[int, typer.Option(min=8, help="Target-generated training sequences.")] = 768,
    prompt_len: Annotated[int, typer.Option(min=2, help="Prompt tokens per sequence (long prompts teach the "
                                            "drafter long contexts).")] = 160,
    gen_len: Annotated[int, typer.Option(min=8, help="Target-generated tokens per sequence.")] = 96,
    greedy_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of greedy continuations.")] = 0.5,
    temperature: Annotated[float, typer.Option(min=0.0, help="Temperature of the sampled continuations.")] = 0.8,
    seed: Annotated[int, typer.Option(help="Seed for data, init and anchors.")] = 0,
    chat_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of the sequences that are chat "
                                                 "prompts (dspark_core/training/data/chat_prompts.yaml) answered "
                                                 "by the target; the rest are code.")] = 0.0,
    code_source: Annotated[str, typer.Option(help="Where code prompts come from: stdlib (the standard library) or "
                                             "site (installed third-party packages, never the held-out code "
                                             "benchmark's: dspark_core/training/code_sources.py).")] = "stdlib",
    def_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of the code prompts that end at a "
                                                "`def` line (the held-out benchmark's shape: the target writes a "
                                                "function body); the rest are random windows.")] = 0.0,
    eval_every: Annotated[int, typer.Option(min=0, help="Steps between points of the training curve: tau at the "
                                            "trained block on held-out code (and chat) greedy rounds, appended "
                                            "to <state-dir>/<head>/curve.jsonl (0 = only at the end).")] = 0,
    prompt_anchors: Annotated[bool, typer.Option(help="Anchor blocks inside the prompts too (the target's "
                                                 "distribution is cached there: more data per target pass).")] = False,
    kl: Annotated[float, typer.Option(min=0.0, help="Weight of a forward-KL term to the target's top-K beside the "
                                      "paper's CE / TV / BCE loss (0 = the paper's loss).")] = 0.0,
    mask_token_id: Annotated[int | None, typer.Option(help="Token the mask slots embed (SGLang / vLLM read it from "
                                                      "the drafter's config; default: the tokenizer's mask token, "
                                                      "else its end-of-text token).")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Checkpoints (in <dir>/<head>) + the target's cached data, "
                                                   "shared by the heads (default: user cache).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore a previous run's checkpoint.")] = False,
    init_from: Annotated[Path | None, typer.Option(help="Start from this drafter's weights (a new schedule of "
                                                   "--steps on this run's data) where no checkpoint is in "
                                                   "--state-dir; its shape must be this command's.")] = None,
    max_minutes: Annotated[float, typer.Option(min=0.0, help="Stop training after this long (0 = no limit); "
                                               "a rerun resumes.")] = 0.0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Target precision while generating data and training: fp32 | bf16 "
                                       "(bf16 matches a bf16 deployment and runs 2x faster on AVX512-BF16).")] = "fp32",
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Train a DSpark drafter for a frozen target (resumes from the checkpoint in --state-dir when present)."""
    from dspark_core.modeling.checkpoint import checkpoint_folder

    target = checkpoint_folder(target)
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dspark_core.drafters.dspark import DraftConfig
    from dspark_core.training.code_sources import SOURCES
    from dspark_core.training.curve import CURVE_FILE, TrainingCurve, drop_curve, heldout_sets
    from dspark_core.training.train import (
        DATA_FILE,
        STATE_FILE,
        LossWeights,
        TrainConfig,
        cache_target,
        evaluate_acceptance,
        load_state,
        train_drafter,
        warm_start,
    )

    if head not in HEADS:
        raise DSparkError(f"--head {head!r} is not one of {', '.join(HEADS)}")
    if code_source not in SOURCES:
        raise DSparkError(f"--code-source {code_source!r} is not one of {', '.join(SOURCES)}")
    if gen_len < block_size + 2:
        raise DSparkError(f"--gen-len {gen_len} is too short for blocks of {block_size}; use at least {block_size + 2}")
    assets = committed_assets(str(target))
    if out is None and assets is None:
        raise DSparkError(f"--out is required for target {target}: committed drafters exist only for the tiny target "
                          "and fetched models")
    folder = out or assets / "drafters" / head  # type: ignore[operator]
    from dspark_core.drafters.draft_vocab import check_writable

    check_writable(folder)  # its draft vocabulary is written after training: a file in the way fails now, not then
    root = state_dir or train_root(target)
    work = root / head
    work.mkdir(parents=True, exist_ok=True)
    if fresh:
        (work / STATE_FILE).unlink(missing_ok=True)
        drop_curve(work / CURVE_FILE)  # only a curve this command wrote
    mask = mask_token_id if mask_token_id is not None else default_mask_token(target)
    cfg = TrainConfig(head=head, block_size=block_size, num_layers=layers, markov_rank=rank, steps=steps,
                      batch_seqs=batch_seqs, anchors_per_seq=anchors, lr=lr, seed=seed, mask_token_id=mask,
                      intermediate_size=intermediate_size, prompt_anchors=prompt_anchors,
                      loss=LossWeights(kl=kl))
    state_file = work / STATE_FILE
    if state_file.is_file():
        prev = load_state(state_file).get("config", {})
        # what makes a different drafter or a different objective; a state written before a key existed had its default
        now = dict(head=cfg.head, block_size=cfg.block_size, num_layers=cfg.num_layers, markov_rank=cfg.markov_rank,
                   mask_token_id=cfg.mask_token_id, intermediate_size=cfg.intermediate_size,
                   prompt_anchors=cfg.prompt_anchors, kl=cfg.loss.kl)
        was = {k: prev.get(k, False) for k in now if k != "kl"} | {"kl": prev.get("loss", {}).get("kl", 0.0)}
        if was != now:
            diff = ", ".join(f"{k} {was[k]} (now {now[k]})" for k in now if was[k] != now[k])
            raise DSparkError(f"{state_file} was trained with other settings: {diff}; rerun with those, "
                              "or pass --fresh or another --state-dir")
    tgt = _load_target(target, device, dtype)
    init = None if init_from is None or state_file.is_file() else warm_start(init_from, tgt, cfg)
    data_file = root / DATA_FILE  # shared by the heads: one generation and one pass of the target for all
    layers = tuple(DraftConfig.for_target(tgt.arch).target_layers)
    meta = dict(sequences=sequences, prompt_len=prompt_len, gen_len=gen_len, greedy_fraction=greedy_fraction,
                temperature=temperature, seed=seed, target=str(target), dtype=dtype, layers=list(layers))
    if chat_fraction:  # a key only when set: a code-only cache written before the option stays valid
        meta["chat_fraction"] = chat_fraction
    if code_source != "stdlib" or def_fraction:  # the same: a cache of the original recipe stays valid
        meta |= {"code_source": code_source, "def_fraction": def_fraction}
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.3f} accept {task.fields[acc]:.3f}"), TimeElapsedColumn(),
            TimeRemainingColumn())
    held = heldout_sets(tgt, target, prompt_len=prompt_len, gen_len=min(gen_len, 64), seed=seed + 1,
                        chat=chat_fraction > 0, code_source=code_source,
                        def_fraction=def_fraction)  # first: a prompt length too short for chat fails before any work
    from rich.console import Console

    # the bar, the start-up line and the curve's points on stderr: stdout holds only the result (--json reads it)
    with Progress(*cols, disable=as_json, transient=False, console=Console(stderr=True)) as progress:
        cached = load_state(data_file) if data_file.is_file() else None
        if cached is not None and cached.get("meta") == meta:
            data = cached["data"]
        else:
            if not progress.console.is_terminal:  # a start-up line in logs: this pass takes minutes
                progress.console.print(f"target continuations: {sequences} rows of {prompt_len} + {gen_len} tokens "
                                       f"(chat share {chat_fraction}, code from {code_source}, def-ending share "
                                       f"{def_fraction}), then the target's states")
            on_rows = _trail(progress, "target continuations", sequences)
            data = target_data(tgt, target, sequences=sequences, prompt_len=prompt_len, gen_len=gen_len,
                               greedy_fraction=greedy_fraction, temperature=temperature, seed=seed, heldout=False,
                               chat_fraction=chat_fraction, code_source=code_source, def_fraction=def_fraction,
                               on_rows=on_rows)
            on_batch = _trail(progress, "target states", data.tokens.shape[0])
            data = cache_target(tgt, data, layers, on_batch=on_batch)
            atomic_write(data_file, lambda tmp: torch.save({"meta": meta, "data": data}, tmp))
        task = progress.add_task(f"train {head}", total=steps, loss=float("nan"), acc=float("nan"))
        ema: dict[str, float] = {}

        def on_step(step: int, stats: dict[str, float]) -> None:
            for k in ("loss", "accept"):
                ema[k] = stats[k] if k not in ema else 0.9 * ema[k] + 0.1 * stats[k]
            progress.update(task, completed=step, loss=ema["loss"], acc=ema["accept"])
            if not progress.console.is_terminal and step % 100 == 0:  # a visible trail in logs too
                progress.console.print(f"train {head}: step {step}/{steps} loss {ema['loss']:.3f} "
                                       f"accept {ema['accept']:.3f}")

        curve = TrainingCurve(work / CURVE_FILE, held, tgt, cfg.block_size, progress.console.print)
        deadline = time.time() + 60 * max_minutes if max_minutes > 0 else None
        recipe = {k: v for k, v in meta.items() if k not in ("target", "layers")}  # no local path in a config
        model = train_drafter(tgt, data, cfg, folder, on_step=on_step, state_dir=work, deadline=deadline,
                              on_eval=curve.point, eval_every=eval_every, data_recipe=recipe, init=init)
    from dspark_core.cli.commands_vocab import write_ranking

    write_ranking(folder, data.tokens, data.prompt_len, model.cfg.vocab_size, meta)  # its reduced draft vocabulary
    acc = evaluate_acceptance(model, tgt, held["code"])
    params = sum(p.numel() for p in model.parameters())
    done = int(load_state(state_file)["step"]) if state_file.is_file() else steps
    last = curve.point(done, model)
    result = {"out": str(folder), "head": head, "steps": done, "params": params,
              "final_loss": ema.get("loss"), "heldout_position_acceptance": [round(a, 4) for a in acc],
              "heldout_tau": {k: v for k, v in last.items() if k.endswith("_tau")}, "curve": str(curve.path)}
    stale = [name for name in ("sts.json", "acceptance.json") if (folder / name).is_file()]
    result["stale"] = [str(folder / name) for name in stale]
    lines = [f"drafter ({head}, {params / 1e6:.2f} M params) -> {folder}",
             "held-out teacher-forced acceptance per position: " + " ".join(f"{a:.2f}" for a in acc),
             "held-out greedy rounds at block " + str(cfg.block_size) + ": "
             + ", ".join(f"{k[:-4]} tau {v:.2f}" for k, v in last.items() if k.endswith("_tau"))]
    if stale:  # measured on the weights just replaced: the engine would read them as this drafter's
        lines.append(f"note: {' and '.join(stale)} in {folder} describe the previous weights; rerun `calibrate` "
                     "(and `bench --record-acceptance`) before deploying this drafter")
    _emit(result, as_json, lines)


def average_drafters_cmd(
    first: Annotated[Path, typer.Option(help="A drafter folder.")],
    second: Annotated[Path, typer.Option(help="A drafter folder of the same shape (its config is kept).")],
    out: Annotated[Path, typer.Option(help="Output folder (a drafter folder this tool wrote, or a new one).")],
    weight: Annotated[float, typer.Option(help="The first drafter's share (0-1, exclusive).")] = 0.5,
    target: Annotated[str, typer.Option(help="Target checkpoint: a folder (HF format) or a fetched model "
                                         "(smollm2-135m).")] = str(ASSETS / "target"),
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Average two drafters of one shape weight by weight (one warm-started from the other: `--init-from`)."""
    from dspark_core.modeling.checkpoint import checkpoint_folder

    target = checkpoint_folder(target)
    from dspark_core.drafters.draft_vocab import check_writable
    from dspark_core.drafters.dspark_layout import ENGINE_CONFIG, is_drafter, save_drafter
    from dspark_core.training.average import average_drafters

    if (out / ENGINE_CONFIG).exists() and not is_drafter(out):
        raise DSparkError(f"{out} holds a {ENGINE_CONFIG} that is not a drafter's; pick another --out")
    check_writable(out)
    tgt = _load_target(target, "cpu", "fp32")
    model = average_drafters(first, second, weight, tgt)
    save_drafter(model, out, target_layers=tgt.arch.num_hidden_layers, max_positions=tgt.arch.max_position_embeddings)
    stale = [str(out / n) for n in ("sts.json", "acceptance.json") if (out / n).is_file()]
    lines = [f"{weight:g} x {first} + {1 - weight:g} x {second} -> {out}"]
    if stale:
        lines.append(f"note: {' and '.join(stale)} describe the weights replaced; rerun `calibrate` (and `bench "
                     "--record-acceptance`) before deploying this drafter")
    _emit({"out": str(out), "weight": weight, "stale": stale}, as_json, lines)


def calibrate_cmd(
    drafter: Annotated[Path, typer.Option(help="Drafter folder.")] = ASSETS / "drafters" / "markov",
    target: Annotated[str, typer.Option(help="Target checkpoint: a folder (HF format) or a fetched model "
                                         "(smollm2-135m).")] = str(ASSETS / "target"),
    out: Annotated[Path | None, typer.Option(help="Output JSON (default: <drafter>/sts.json).")] = None,
    sequences: Annotated[int, typer.Option(min=4, help="Held-out prompts.")] = 96,
    anchors: Annotated[int, typer.Option(min=1, help="Rounds per held-out sequence.")] = 12,
    prompt_len: Annotated[int, typer.Option(min=2, help="Prompt tokens per sequence.")] = 160,
    gen_len: Annotated[int, typer.Option(min=8, help="Greedy target tokens per sequence.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed for prompts and anchors.")] = 0,
    chat_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of held-out chat prompts beside "
                                                 "the held-out code (a drafter trained on chat too).")] = 0.0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Target precision: fp32 | bf16 (the deployment's).")] = "fp32",
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Fit STS temperatures on held-out greedy rounds; write SGLang's DSparkStsCalibration JSON."""
    from dspark_core.modeling.checkpoint import checkpoint_folder

    target = checkpoint_folder(target)
    from dspark_core.drafters.dspark_layout import load_drafter
    from dspark_core.training.rounds import simulate_greedy_rounds
    from dspark_core.verification.calibrate import calibration_from_fit, fit_sts, survival_labels

    tgt = _load_target(target, device, dtype)
    model = load_drafter(drafter, tgt)
    if gen_len < model.cfg.block_size + 2:
        raise DSparkError(f"--gen-len {gen_len} is too short for the drafter's blocks of {model.cfg.block_size}")
    held = target_data(tgt, target, sequences=sequences, prompt_len=prompt_len, gen_len=gen_len,
                       greedy_fraction=1.0, temperature=0.0, seed=seed + 100, heldout=True,
                       chat_fraction=chat_fraction)
    rounds = simulate_greedy_rounds(model, tgt, held.tokens, prompt_len, anchors_per_seq=anchors, seed=seed)
    fit = fit_sts(rounds.confidence_logits, survival_labels(rounds.accepted, rounds.gamma))
    n = int(rounds.accepted.numel())
    what = "stdlib-heldout" + (f" + chat-heldout ({chat_fraction:g})" if chat_fraction else "")
    cal = calibration_from_fit(fit, dataset=f"{what} greedy rounds ({target.name})", num_samples=n)
    path = out or drafter / "sts.json"
    cal.save(path)
    lines = [f"STS over {n} held-out rounds -> {path}", "pos  T       ECE before  ECE after"]
    lines += [f"{k + 1:>3}  {t:6.3f}  {b:10.4f}  {a:9.4f}"
              for k, (t, b, a) in enumerate(zip(cal.temperatures, cal.ece_before, cal.ece_after, strict=True))]
    _emit({"out": str(path), **cal.model_dump(), "position_acceptance": rounds.position_acceptance()}, as_json, lines)
