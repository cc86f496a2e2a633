"""Chat prompts for training a drafter on what an instruction-tuned target writes (issue 42).

The prompts are the product of the templates and fillers in `data/chat_prompts.yaml`, shuffled by a seed, wrapped in
the ChatML turn the held-out benchmark prompts use (SmolLM2-Instruct's template). 2 % of the product (by a hash of
the text) is a held-out split for the training curve, and no prompt names a topic of the benchmark's held-out chat
prompts (the file's `avoid` list), so the benchmark's chat figures stay held out.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Collection
from functools import cache
from pathlib import Path

from dspark_core.errors import DSparkError
from dspark_core.safe_yaml import load_yaml

DATA = Path(__file__).with_name("data") / "chat_prompts.yaml"
TURN = "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"  # ChatML, as benchmarks/prompts/heldout_chat


@cache
def chat_texts() -> tuple[str, ...]:
    """Every filled template, in file order, without those naming an avoided topic."""
    spec, _ = load_yaml(DATA.read_text(encoding="utf-8"), DATA)
    avoid = re.compile(r"\b(" + "|".join(re.escape(a) for a in spec["avoid"]) + r")\b", re.IGNORECASE)
    out: list[str] = []
    for tpl in spec["templates"]:
        slot = re.search(r"\{(\w+)\}", tpl).group(1)  # type: ignore[union-attr]  # one slot per template
        out += [t for t in (tpl.replace("{" + slot + "}", f) for f in spec["fillers"][slot]) if not avoid.search(t)]
    return tuple(out)


def is_heldout_text(text: str) -> bool:
    """2 % of the prompts (by a hash of the text) are held out for the training curve."""
    return hashlib.sha1(text.encode()).digest()[0] < 6


def chat_prompts(encode: Callable[[str], list[int]], count: int, *, max_len: int, seed: int,
                 heldout: bool, exclude: Collection[tuple[int, ...]] = ()) -> list[list[int]]:
    """`count` ChatML prompts of at most `max_len` tokens from the training (or held-out) split, none of `exclude`
    (e.g. a suffix corpus's own prompts), drawn with replacement once the split is used up (a prompt's sampled
    continuations then differ)."""
    texts = [t for t in chat_texts() if is_heldout_text(t) == heldout]
    ids = [p for p in (encode(TURN.format(text=t)) for t in texts) if len(p) <= max_len and tuple(p) not in exclude]
    if not ids:
        split = "held-out" if heldout else "training"
        raise DSparkError(f"no chat prompt of the {split} split fits in {max_len} tokens; raise --prompt-len")
    rng = random.Random(seed)
    rng.shuffle(ids)
    return [ids[i % len(ids)] for i in range(count)]
