"""CLI command `calibrate-suffix`: fit suffix decoding's ratio -> acceptance map (training/suffix_fit.py).

The target continues prompts greedily (code windows of the standard library and chat prompts, the training split
with a seed of its own: suffix decoding has no weights, so no split of these was ever fitted to); suffix decoding's
rounds over them are simulated exactly, and a logistic model of each drafted token's acceptance is fitted on half
of the sequences and scored on the other half. With a frozen corpus (`--corpus`, the target's committed one by
default) each tree's drafts are fitted, the corpus's own; the corpus's chat prompts are left out of the calibration's,
so its drafts are scored on text it never saw. The result goes beside the target's committed assets, where
`drafter.suffix_calibration: auto` finds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.drafters.suffix_corpus import CorpusIndex


def register(app: typer.Typer) -> None:
    app.command("calibrate-suffix")(calibrate_suffix_cmd)


def calibrate_suffix_cmd(
    target: Annotated[str, typer.Option(help="Target checkpoint: a folder (HF format) or a fetched model "
                                         "(smollm2-135m).")] = "smollm2-135m",
    config: Annotated[Path | None, typer.Option(help="Engine config whose drafter.suffix_* settings to calibrate "
                                                "(default: the engine's defaults).")] = None,
    sequences: Annotated[int, typer.Option(min=8, max=4096, help="Greedy target continuations (half fit, half "
                                           "scored).")] = 96,
    chat_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of chat prompts.")] = 0.5,
    prompt_len: Annotated[int, typer.Option(min=8, help="Prompt tokens of a code row (chat rows: shorter).")] = 96,
    gen_len: Annotated[int, typer.Option(min=16, help="Target tokens per code row.")] = 128,
    gamma: Annotated[int, typer.Option(min=1, max=16, help="Block: the most tokens a round drafts.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the prompts.")] = 1000,
    out: Annotated[Path | None, typer.Option(help="Output JSON (default: suffix_calibration.json beside the "
                                             "target's committed assets).")] = None,
    dtype: Annotated[str, typer.Option(help="Target precision while generating: fp32 | bf16.")] = "fp32",
    corpus: Annotated[str, typer.Option(help="Suffix corpus whose drafts to fit too: auto (the target's committed "
                                        "one, if any) | none | a build-suffix-corpus JSON.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Fit the map from suffix decoding's frequency ratios to measured acceptance (the hybrid's common scale)."""
    from rich.console import Console

    from dspark_core.cli.commands_dspark import _emit, _load_target
    from dspark_core.config import EngineConfig, committed_assets, load_config
    from dspark_core.drafters.suffix import from_config
    from dspark_core.drafters.suffix_calibration import FILE
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from dspark_core.training.suffix_fit import fit_calibration
    from dspark_core.training.target_data import target_rows

    folder = checkpoint_folder(target)
    assets = committed_assets(str(folder))
    path = out or (assets / FILE if assets is not None else None)
    if path is None:
        raise DSparkError(f"--out is required for target {target}: it has no committed assets folder")
    cfg = load_config(config) if config else EngineConfig()
    d = cfg.drafter
    say = Console(stderr=True, quiet=as_json).print
    say(f"calibrate-suffix: {sequences} greedy continuations of {target} ({dtype}), chat share {chat_fraction}, "
        f"block {gamma}, depth {d.suffix_depth}, spec factor {d.suffix_spec_factor}, min prob {d.suffix_min_prob}")
    tgt = _load_target(folder, "cpu", dtype)
    index, exclude, corpus_note = _corpus(corpus, folder, tgt.arch.vocab_size, d.suffix_depth)
    say(f"  corpus: {corpus_note}")
    data, starts = target_rows(tgt, folder, sequences=sequences, prompt_len=prompt_len, gen_len=gen_len,
                               greedy_fraction=1.0, temperature=0.0, seed=seed, heldout=False,
                               chat_fraction=chat_fraction, chat_exclude=exclude)
    n_code = sequences - round(chat_fraction * sequences)
    rows = data.tokens.tolist()
    # code and chat interleaved, so the fitted half and the scored half hold both
    order = sorted(range(sequences), key=lambda i: (i if i < n_code else i - n_code, i >= n_code))
    seqs = [(rows[i], starts[i]) for i in order]
    say("simulating suffix rounds and fitting ...")
    drafter = from_config(cfg, corpus=index)  # the raw ratios: the calibration is what this fits
    try:
        cal = fit_calibration(seqs, drafter, gamma, fitted_on={
            "target": folder.name, "dtype": dtype, "corpus": corpus_note,
            "prompts": f"stdlib code windows + chat_prompts.yaml, seed {seed}"
                       + (f", without the corpus's {len(exclude)} chat prompts" if exclude else ""),
            "chat_fraction": chat_fraction, "suffix_depth": d.suffix_depth,
            "suffix_spec_factor": d.suffix_spec_factor, "suffix_min_prob": d.suffix_min_prob})
    except ValueError as e:
        raise DSparkError(str(e)) from None
    cal.save(path)
    h = cal.heldout
    lines = [f"suffix calibration -> {path}",
             f"held-out half ({h['rows']} drafted tokens, {h['rounds']} rounds): Brier {h['brier_raw']} raw -> "
             f"{h['brier_calibrated']} calibrated, ECE {h['ece_raw']} -> {h['ece_calibrated']}",
             f"accepted per round: measured {h['accepted_per_round_measured']}, predicted raw "
             f"{h['accepted_per_round_raw']}, calibrated {h['accepted_per_round_calibrated']}",
             f"without the tree features: Brier {h['brier_without_trees']}"]
    lines += [f"  {t} tree's drafts ({v['rows']} tokens): accepted {v['accept_rate']}, predicted "
              f"{v['predicted_calibrated']} (without the tree features {v['predicted_without_trees']})"
              for t, v in h["by_tree"].items()]
    _emit({"out": str(path), **cal.model_dump()}, as_json, lines)


def _corpus(choice: str, folder: Path, vocab: int, depth: int
            ) -> tuple[CorpusIndex | None, set[tuple[int, ...]], str]:
    """`--corpus`: the index, the chat prompts it continued (left out of the calibration's), and a line saying which.
    A corpus that does not record its prompts, or holds the calibration's own code source, is refused: its drafts
    would be scored on text it holds."""
    from dspark_core.config import committed_file
    from dspark_core.drafters.suffix_corpus import FILE, CorpusIndex, read_corpus
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.training.chat_prompts import chat_prompts

    path = committed_file(choice, str(folder), FILE)
    if path is None:
        return None, set(), "none"
    c = read_corpus(path, vocab)
    if (c.chat_count and (c.chat_seed is None or c.chat_max_len is None)) or (c.code_count and c.code_source is None):
        raise DSparkError(f"{path}: the corpus does not record which prompts it continued, so the calibration cannot "
                          "leave them out; rebuild it with `python cli.py build-suffix-corpus` or pass --corpus none")
    if c.code_count and c.code_source == "stdlib":
        raise DSparkError(f"{path}: the corpus continued stdlib code windows, the calibration's own source; rebuild "
                          "it with --code-source site or pass --corpus none")
    exclude: set[tuple[int, ...]] = set()
    if c.chat_count:
        enc = Tokenizer.load(folder).encode
        exclude = {tuple(p) for p in chat_prompts(enc, c.chat_count, max_len=c.chat_max_len, seed=c.chat_seed,
                                                  heldout=False)}
    return CorpusIndex(c.sequences, depth), exclude, f"{path.name}: {c.prompts}"
