"""Which DSpark drafter the deployment runs: a published one for the model, a folder, the tiny drafters, or none.

`--drafter` takes `auto` (the default: the model's published drafter from profiler/catalog/drafters.yaml, the
committed tiny drafters for the tiny target, else none), `none` (train one for the tuned configuration), or a
drafter folder in the engines' layout (what `train-drafter` writes). The profile's `drafter.*` then fixes what a
checkpoint fixes (kb/match.py): its head, its depth and the longest block it can draft.
"""

from __future__ import annotations

from pathlib import Path

from profiler.catalog import published_drafter
from profiler.errors import ProfileError
from profiler.schema import DrafterProfile

HEAD_ORDER = ("none", "markov", "rnn")


def tiny_drafters() -> DrafterProfile | None:
    """The committed drafters of the tiny target (one per head, same depth and block)."""
    from dspark_core.config import ASSETS
    from dspark_core.drafter import is_drafter, read_drafter_config

    folders = [ASSETS / "drafters" / h for h in HEAD_ORDER if is_drafter(ASSETS / "drafters" / h)]
    if not folders:
        return None
    cfgs = [read_drafter_config(f) for f in folders]
    return DrafterProfile(id=str(ASSETS / "drafters"), source="dspark_core/assets/tiny/drafters (trained here)",
                          heads=[c.head for c in cfgs], layers=cfgs[0].num_layers,
                          block_size=min(c.block_size for c in cfgs), markov_rank=cfgs[0].markov_rank,
                          confidence_head=True)


def folder_drafter(path: Path) -> DrafterProfile:
    """A drafter checkpoint folder (either layout)."""
    from dspark_core.drafter import read_drafter_config
    from dspark_core.errors import DSparkError

    try:
        cfg = read_drafter_config(path)
    except DSparkError as e:
        raise ProfileError(f"--drafter {path}: {e}") from None
    return DrafterProfile(id=str(path.resolve()), source=f"drafter folder {path}", heads=[cfg.head],
                          layers=cfg.num_layers, block_size=cfg.block_size, markov_rank=cfg.markov_rank,
                          confidence_head=True)


def drafter_profile(choice: str | None, model_name: str | None, is_tiny: bool) -> tuple[DrafterProfile, list[str]]:
    """The drafter section for `--drafter choice` (None or "auto": what exists for this model)."""
    if choice and choice not in ("auto", "none"):
        p = Path(choice).expanduser()
        if not p.is_dir():
            raise ProfileError(f"--drafter {choice}: no such folder; give auto, none or a drafter folder "
                               "(train one with `python cli.py train-drafter`)")
        return folder_drafter(p).model_copy(update={"chosen": str(p.resolve())}), []
    if choice == "none":
        return DrafterProfile(chosen="none"), ["no drafter chosen (--drafter none): the plan searches head, depth "
                                               "and block; train the tuned one with `python cli.py train-drafter`"]
    if is_tiny:
        tiny = tiny_drafters()
        if tiny is not None:
            return tiny, []
    pub = published_drafter(model_name)
    if pub is None:
        return DrafterProfile(), [f"no published DSpark drafter for {model_name or 'this model'}: the plan searches "
                                  "head, depth and block; the bundle needs DRAFT_MODEL_PATH to one trained for them"]
    return DrafterProfile(id=pub.id, source=pub.source, heads=[pub.head], layers=pub.layers,
                          block_size=pub.block_size, markov_rank=pub.markov_rank,
                          confidence_head=pub.confidence_head), [f"drafter: {pub.id} ({pub.source})"]
