"""Two drafters of one shape averaged weight by weight (a "model soup", Wortsman et al. 2022).

A drafter warm-started from another (`train-drafter --init-from`) and trained on new data sits in the same basin as
the one it started from: their average keeps what each learned (on SmolLM2-135M the committed drafter measured
higher on code, the one trained on from it higher on chat, and their average above the first on both; RESULTS.md).
Only drafters of one shape, trained for one target, average: anything else is refused with one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.drafters.dspark import DSparkDraftModel
    from dspark_core.modeling.model import LeanModel

def average_drafters(first: Path, second: Path, weight: float, target: LeanModel) -> DSparkDraftModel:
    """`weight` x the drafter in `first` + (1 - weight) x the one in `second`, with the second's config; its
    config's extra records both and the weight."""
    from dspark_core.drafters.dspark_layout import load_drafter
    from dspark_core.training.train import shape_diff

    if not 0.0 < weight < 1.0:
        raise DSparkError(f"--weight {weight}: give the first drafter's share, strictly between 0 and 1")
    a, b = load_drafter(first, target), load_drafter(second, target)
    diff = shape_diff(a.cfg, b.cfg)
    if diff:
        raise DSparkError(f"{first} and {second} are drafters of other shapes ({', '.join(diff)}): only drafters of "
                          "one shape average")
    sa = a.state_dict()
    with torch.no_grad():
        for name, p in b.state_dict().items():
            if p.is_floating_point():
                p.copy_(weight * sa[name].float() + (1.0 - weight) * p.float())
    b.cfg.extra = {**(b.cfg.extra or {}), "averaged": {"weight_of_first": weight, "first": _source(first, a),
                                                       "second": _source(second, b)}}
    return b


def _source(folder: Path, model: DSparkDraftModel) -> dict[str, Any]:
    """What a drafter was, for the averaged one's config: its folder's name, when and on what it trained."""
    extra = model.cfg.extra or {}
    return {"drafter": Path(folder).name, "trained_at": extra.get("trained_at"), "data": extra.get("data", []),
            **({"init_from": extra["init_from"]} if "init_from" in extra else {})}
