"""CLI command `draft-vocab`: rank the target's output tokens of a drafter's training data into its reduced draft
vocabulary (drafters/draft_vocab.py), beside the drafter.

`train-drafter` writes the ranking with every drafter it exports; this command writes it for a drafter trained
before that, from the `train-drafter` state folder whose data it trained on (train_data.pt: the target's own
continuations). Nothing is generated again: it reads the cached rows' tokens (mapped, not the whole file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_core.errors import DSparkError


def register(app: typer.Typer) -> None:
    app.command("draft-vocab")(draft_vocab_cmd)


def draft_vocab_cmd(
    state_dir: Annotated[Path, typer.Option(help="The `train-drafter --state-dir` folder whose train_data.pt the "
                                            "drafter trained on.")],
    drafter: Annotated[Path, typer.Option(help="Drafter folder the ranking goes into (draft_vocab.json).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Rank the target's tokens in a drafter's training continuations: its reduced draft vocabulary."""
    from dspark_core.cli.commands_dspark import _emit
    from dspark_core.drafters.dspark_layout import is_drafter, read_drafter_config
    from dspark_core.training.train import DATA_FILE, load_state

    data_file = state_dir / DATA_FILE
    if not data_file.is_file():
        raise DSparkError(f"{data_file} does not exist: pass the --state-dir `train-drafter` used for this drafter")
    if not is_drafter(drafter):
        raise DSparkError(f"{drafter} holds no DSpark drafter (config.json + model.safetensors)")
    cfg = read_drafter_config(drafter)
    cached = load_state(data_file, mmap=True)  # only the tokens are read, not the cached target states
    meta, data = cached.get("meta"), cached.get("data")
    if not isinstance(meta, dict) or data is None or not hasattr(data, "tokens"):
        raise DSparkError(f"{data_file} holds no training rows this tool wrote; rerun `train-drafter`")
    vocab = write_ranking(drafter, data.tokens, data.prompt_len, cfg.vocab_size, meta)
    _emit({"out": str(drafter / "draft_vocab.json"), "tokens": len(vocab.tokens), "written": sum(vocab.counts)},
          as_json, [f"draft vocabulary: {len(vocab.tokens)} distinct target tokens ranked over {sum(vocab.counts)} "
                    f"it wrote -> {drafter / 'draft_vocab.json'}"])


def write_ranking(folder: Path, tokens, prompt_len: int, vocab_size: int, meta: dict):  # noqa: ANN001, ANN201
    """Rank `tokens` [S, T] (prompt_len prompt tokens a row) and save the ranking in `folder`; the recipe in `meta`
    goes with it, without local paths."""
    from dspark_core.drafters.draft_vocab import VocabFile, rank_tokens, save_vocab

    if int(tokens.max()) >= vocab_size:
        raise DSparkError(f"the training rows hold token ids past the drafter's vocabulary ({vocab_size}): they are "
                          "another target's; pass the --state-dir this drafter trained from")
    ids, counts = rank_tokens(tokens, prompt_len, vocab_size)
    source = {k: v for k, v in meta.items() if k not in ("target", "layers") and isinstance(v, (str, int, float))}
    vocab = VocabFile(vocab_size=vocab_size, tokens=ids, counts=counts, source=source)
    save_vocab(folder, vocab)
    return vocab
