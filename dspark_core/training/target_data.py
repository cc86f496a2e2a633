"""The training and held-out data of a drafter: prompts continued by the target itself.

Code rows are windows of the standard library's sources or of installed third-party packages (code_sources.py);
chat rows (`chat_fraction` of them) are ChatML prompts from `chat_prompts.py`. Every row has the same length,
prompt_len + gen_len: a chat prompt is shorter than `prompt_len`, so the target writes more of its row, and every
position from prompt_len - 1 on is target-written in both kinds (the anchors of `train.train_drafter` without
prompt anchors).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dspark_core.errors import DSparkError
from dspark_core.training.train import TrainData, generate_continuations

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel

CHUNK = 128  # rows generated together


def code_prompts(target_path: Path, *, count: int, length: int, seed: int, heldout: bool, source: str = "stdlib",
                 def_fraction: float = 0.0) -> torch.Tensor:
    """Windows of `length` tokens from `source`'s code (code_sources.py): the training split (heldout=False) or its
    held-out ~2 % (heldout=True, for calibration and the training curve) -> [count, length]."""
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.training.code_sources import SOURCES, code_windows, site_sources, stdlib_groups

    if source not in SOURCES:
        raise DSparkError(f"code source {source!r} is not one of {', '.join(SOURCES)}")
    groups = stdlib_groups(heldout) if source == "stdlib" else site_sources(heldout)
    return code_windows(Tokenizer.load(target_path).encode, groups, count=count, length=length, seed=seed,
                        def_fraction=def_fraction)


def _continue(target: LeanModel, prompts: torch.Tensor, new_tokens: int, greedy_fraction: float,
              temperature: float, seed: int, on_rows: Callable[[int], None] | None = None) -> torch.Tensor:
    """[S, P] -> [S, P + new_tokens], CHUNK rows at a time; the first greedy_fraction of the rows greedy.
    `on_rows(n)` after each chunk (a progress bar)."""
    s = prompts.shape[0]
    greedy = round(greedy_fraction * s)
    chunks = []
    for start in range(0, s, CHUNK):
        part = prompts[start:start + CHUNK].to(target.device)
        rows = min(part.shape[0], max(0, greedy - start))
        chunks.append(generate_continuations(target, part, new_tokens, temperature=temperature, greedy_rows=rows,
                                             seed=seed + start).cpu())
        if on_rows:
            on_rows(part.shape[0])
    return torch.cat(chunks)


def target_data(target: LeanModel, target_path: Path, *, sequences: int, prompt_len: int, gen_len: int,
                greedy_fraction: float, temperature: float, seed: int, heldout: bool,
                chat_fraction: float = 0.0, code_source: str = "stdlib", def_fraction: float = 0.0,
                on_rows: Callable[[int], None] | None = None) -> TrainData:
    """`sequences` rows of prompt_len + gen_len tokens, continued by the target: code rows, then chat rows."""
    return target_rows(target, target_path, sequences=sequences, prompt_len=prompt_len, gen_len=gen_len,
                       greedy_fraction=greedy_fraction, temperature=temperature, seed=seed, heldout=heldout,
                       chat_fraction=chat_fraction, code_source=code_source, def_fraction=def_fraction,
                       on_rows=on_rows)[0]


def target_rows(target: LeanModel, target_path: Path, *, sequences: int, prompt_len: int, gen_len: int,
                greedy_fraction: float, temperature: float, seed: int, heldout: bool,
                chat_fraction: float = 0.0, code_source: str = "stdlib", def_fraction: float = 0.0,
                on_rows: Callable[[int], None] | None = None, chat_exclude: Collection[tuple[int, ...]] = ()
                ) -> tuple[TrainData, list[int]]:
    """`target_data`, and each row's own prompt length (a chat prompt is shorter than `prompt_len`); `on_rows(n)`
    as each chunk of n rows is written; no chat prompt of `chat_exclude`."""
    n_chat = round(chat_fraction * sequences)
    rows, starts = [], []
    if n_chat < sequences:
        rows.append(_continue(target, code_prompts(target_path, count=sequences - n_chat, length=prompt_len,
                                                   seed=seed, heldout=heldout, source=code_source,
                                                   def_fraction=def_fraction), gen_len, greedy_fraction,
                              temperature, seed, on_rows))
        starts += [prompt_len] * (sequences - n_chat)
    if n_chat:
        from dspark_core.modeling.tokenizer import Tokenizer
        from dspark_core.training.chat_prompts import chat_prompts

        enc = Tokenizer.load(target_path).encode
        by_len: dict[int, list[list[int]]] = defaultdict(list)  # a batch shares its prompt length
        for p in chat_prompts(enc, n_chat, max_len=prompt_len - 1, seed=seed, heldout=heldout,
                              exclude=chat_exclude):
            by_len[len(p)].append(p)
        for n, group in sorted(by_len.items()):
            rows.append(_continue(target, torch.tensor(group), prompt_len + gen_len - n, greedy_fraction, temperature,
                                  seed + 7919 * n, on_rows))
            starts += [n] * len(group)
    return TrainData(tokens=torch.cat(rows), prompt_len=prompt_len), starts
