"""CLI command `build-suffix-corpus`: the target's own outputs for suffix decoding's frozen corpus (suffix_corpus.py).

The target continues training prompts greedily with the engine's plain loop (batched, compiled where asked): chat
prompts of `chat_prompts.yaml`'s training split, and optionally code windows of the environment's packages outside
the held-out benchmark's (`--code-source site`). The outputs, without their prompts, go beside the target's committed
assets, where `drafter.suffix_corpus: auto` finds them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from dspark_core.errors import DSparkError

CHUNK = 64  # prompts a progress line covers


def register(app: typer.Typer) -> None:
    app.command("build-suffix-corpus")(build_suffix_corpus_cmd)


def _refuse_foreign(path: Path) -> None:
    """Overwrite only a corpus file (this command's); anything else at `path` is the user's."""
    from dspark_core.drafters.suffix_corpus import MAX_BYTES, CorpusFile
    from dspark_core.userfiles import read_capped

    if not path.exists() and not path.is_symlink():
        return
    try:
        CorpusFile.model_validate_json(read_capped(path, MAX_BYTES, "suffix corpus"))
    except (DSparkError, ValueError):
        raise DSparkError(f"{path} exists and is not a suffix corpus; pass another --out (it is left as it is)"
                          ) from None


def build_suffix_corpus_cmd(
    target: Annotated[str, typer.Option(help="Target checkpoint: a folder (HF format) or a fetched model "
                                         "(smollm2-135m).")] = "smollm2-135m",
    chat_sequences: Annotated[int, typer.Option(min=0, max=65536, help="Chat prompts to continue (training "
                                                "split of chat_prompts.yaml).")] = 768,
    code_sequences: Annotated[int, typer.Option(min=0, max=65536, help="Code windows to continue.")] = 0,
    code_source: Annotated[str, typer.Option(help="Code windows from: stdlib | site (packages outside the "
                                             "held-out benchmark's).")] = "site",
    prompt_len: Annotated[int, typer.Option(min=8, max=4096, help="Most tokens of a chat prompt; a code "
                                            "window's length.")] = 160,
    max_new_tokens: Annotated[int, typer.Option(min=8, max=4096, help="Tokens a continuation may reach.")] = 128,
    dtype: Annotated[str, typer.Option(help="Target precision: fp32 | bf16.")] = "bf16",
    batch: Annotated[int, typer.Option(min=1, max=256, help="Requests generated together.")] = 8,
    compile_steps: Annotated[bool, typer.Option("--compile/--no-compile", help="Compiled decode steps.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the prompts.")] = 7,
    out: Annotated[Path | None, typer.Option(help="Output JSON (default: suffix_corpus.json beside the target's "
                                             "committed assets).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Build suffix decoding's frozen corpus: the target's greedy outputs for training prompts."""
    from rich.console import Console

    from dspark_core.cli.commands_dspark import _emit
    from dspark_core.config import EngineConfig, committed_assets
    from dspark_core.drafters.suffix_corpus import FILE, MAX_TOKENS, CorpusFile, CorpusIndex, save_corpus
    from dspark_core.engine import Engine
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from dspark_core.training.chat_prompts import chat_prompts
    from dspark_core.training.target_data import code_prompts
    from dspark_core.verification.sampling import SamplingParams

    if dtype not in ("fp32", "bf16"):
        raise DSparkError(f"--dtype {dtype!r} is not fp32 or bf16")
    from dspark_core.training.code_sources import SOURCES

    if chat_sequences + code_sequences == 0:
        raise DSparkError("nothing to generate: pass --chat-sequences or --code-sequences above 0")
    if code_sequences and code_source not in SOURCES:
        raise DSparkError(f"--code-source {code_source!r} is not one of {', '.join(SOURCES)}")
    most = (chat_sequences + code_sequences) * max_new_tokens
    if most > MAX_TOKENS:  # refused before generating, not after: load_corpus would refuse the file
        raise DSparkError(f"up to {most} tokens ({chat_sequences + code_sequences} x {max_new_tokens}) is over the "
                          f"{MAX_TOKENS} a corpus file holds; pass fewer sequences or --max-new-tokens")
    folder = checkpoint_folder(target)
    assets = committed_assets(str(folder))
    path = out or (assets / FILE if assets is not None else None)
    if path is None:
        raise DSparkError(f"--out is required for target {target}: it has no committed assets folder")
    _refuse_foreign(path)
    say = Console(stderr=True, quiet=as_json).print
    cfg = EngineConfig.model_validate({"model": {"path": str(folder)}, "weights": {"dtype": dtype},
                                       "compile": compile_steps, "batch": {"max_requests": batch},
                                       "spec": {"enabled": False}})
    engine = Engine(cfg)
    tok = engine.tokenizer
    if tok is None:
        raise DSparkError(f"{folder} has no tokenizer to build prompts with")
    prompts = chat_prompts(tok.encode, chat_sequences, max_len=prompt_len, seed=seed, heldout=False) \
        if chat_sequences else []
    if code_sequences:
        prompts += code_prompts(folder, count=code_sequences, length=prompt_len, seed=seed, heldout=False,
                                source=code_source, def_fraction=0.5).tolist()
    say(f"build-suffix-corpus: {len(prompts)} greedy continuations of {target} ({dtype}, {max_new_tokens} tokens, "
        f"{batch} at a time) -> {path}")
    sp = SamplingParams(max_new_tokens=max_new_tokens)
    seqs: list[list[int]] = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), CHUNK):
        gen = engine.generate(prompts[i:i + CHUNK], sp)
        seqs += [o.token_ids for o in gen.outputs]
        took = time.perf_counter() - t0
        left = took / len(seqs) * (len(prompts) - len(seqs))
        say(f"  {len(seqs)}/{len(prompts)} continuations, {sum(map(len, seqs))} tokens, {took:.0f} s, "
            f"ETA {left:.0f} s")
    kinds = [f"{chat_sequences} chat prompts (chat_prompts.yaml, training split)"] if chat_sequences else []
    if code_sequences:
        kinds.append(f"{code_sequences} {code_source} code windows of {prompt_len} tokens (training split)")
    corpus = CorpusFile(target=folder.name, dtype=dtype, prompts=f"{' + '.join(kinds)}, seed {seed}",
                        max_new_tokens=max_new_tokens, chat_count=chat_sequences,
                        chat_seed=seed if chat_sequences else None,
                        chat_max_len=prompt_len if chat_sequences else None, code_count=code_sequences,
                        code_source=code_source if code_sequences else None, sequences=seqs)
    save_corpus(path, corpus)
    index = CorpusIndex(seqs, cfg.drafter.suffix_depth)
    _emit({"out": str(path), "sequences": len(seqs), "tokens": index.tokens, "index_bytes": index.nbytes,
           "seconds": round(time.perf_counter() - t0, 1)}, as_json,
          [f"suffix corpus -> {path}: {len(seqs)} outputs, {index.tokens} tokens (index {index.nbytes / 1e6:.1f} MB)"])
