"""The training curve of a drafter: tau on held-out greedy rounds as training goes (issue 42).

A point simulates the engine's verify-all greedy rounds (`rounds.simulate_greedy_rounds`) at the trained block on
held-out target continuations, code and (when the drafter trains on chat) chat, and appends one JSON line to
`curve.jsonl` in the head's state folder, so a resumed run continues the same curve and the learning curve says
whether more steps or more data would pay.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_core.training.rounds import simulate_greedy_rounds

if TYPE_CHECKING:
    from dspark_core.drafters.dspark import DSparkDraftModel
    from dspark_core.modeling.model import LeanModel
    from dspark_core.training.train import TrainData

CURVE_FILE = "curve.jsonl"  # one line per point: step, minutes, <domain>_tau, <domain>_accept
CURVE_MAX_BYTES = 1 << 20  # a point is ~200 bytes: a larger file of this name is not a curve `--fresh` may drop


def heldout_sets(target: LeanModel, target_path: Path, *, prompt_len: int, gen_len: int, seed: int,
                 chat: bool, code_source: str = "stdlib", def_fraction: float = 0.0) -> dict[str, TrainData]:
    """Greedy target continuations of held-out prompts: 32 code rows (held-out files of the training's code source,
    windows shaped as its), and 16 chat rows when `chat`."""
    from dspark_core.training.target_data import target_data

    sets = {"code": target_data(target, target_path, sequences=32, prompt_len=prompt_len, gen_len=gen_len,
                                greedy_fraction=1.0, temperature=0.0, seed=seed, heldout=True,
                                code_source=code_source, def_fraction=def_fraction)}
    if chat:
        sets["chat"] = target_data(target, target_path, sequences=16, prompt_len=prompt_len, gen_len=gen_len,
                                   greedy_fraction=1.0, temperature=0.0, seed=seed, heldout=True, chat_fraction=1.0)
    return sets


def drop_curve(path: Path) -> bool:
    """Remove a training curve for a fresh run, only when every line is a point `TrainingCurve` wrote (a step and a
    code tau): a file of the same name that the program did not write is left alone. Whether it was removed."""
    try:
        if path.stat().st_size > CURVE_MAX_BYTES:  # far past any curve this writes: not ours, and not read whole
            return False
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not rows or not all(isinstance(r, dict) and "step" in r and "code_tau" in r for r in rows):
        return False
    path.unlink()
    return True


class TrainingCurve:
    """Appends a point per call; `point` is train_drafter's `on_eval`."""

    def __init__(self, path: Path, held: dict[str, TrainData], target: LeanModel, gamma: int,
                 say: Callable[[str], None] | None = None) -> None:
        self.path, self.held, self.target, self.gamma, self.say = path, held, target, gamma, say
        self.t0 = time.time()
        self.last: dict = {}  # the latest point (the final call repeats none)

    def point(self, step: int, model: DSparkDraftModel) -> dict[str, float]:
        """Measure and record one point -> {step, minutes, <domain>_tau, <domain>_accept (per position)}."""
        if self.last.get("step") == step:
            return self.last
        row: dict = {"step": step, "minutes": round((time.time() - self.t0) / 60, 2)}
        for name, data in self.held.items():
            rounds = simulate_greedy_rounds(model, self.target, data.tokens, data.prompt_len, anchors_per_seq=8,
                                            seed=1)
            row[f"{name}_tau"] = round(rounds.tau(self.gamma), 4)
            row[f"{name}_accept"] = [round(a, 3) for a in rounds.position_acceptance()]
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.say:
            self.say(f"curve step {step}: " + ", ".join(f"{k[:-4]} tau {v:.3f}" for k, v in row.items()
                                                        if k.endswith("_tau")))
        self.last = row
        return row
