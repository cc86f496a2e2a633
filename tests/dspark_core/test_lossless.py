"""Greedy speculative decoding is token-identical to plain greedy decoding (every block length 1..16)."""

from __future__ import annotations

import pytest
from conftest import engine_config

from dspark_core.drafters.ar_draft import ARDrafter
from dspark_core.drafters.ngram import NgramDrafter
from dspark_core.engine import Engine
from dspark_core.verification.sampling import SamplingParams

PROMPTS = [
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    if i % 2 == 0:\n",
    "x",
    "    return self._",
    '"""Utilities for parsing.\n\nThis module',
]
SP = SamplingParams(max_new_tokens=20, ignore_eos=False)


@pytest.fixture(scope="module")
def plain(tiny_target, tiny_tokenizer) -> list[list[int]]:
    eng = Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer)
    return [o.token_ids for o in eng.generate(PROMPTS, SP).outputs]


@pytest.mark.parametrize("block", list(range(1, 17)))
def test_ar_draft_greedy_is_lossless(block: int, plain, tiny_target, tiny_draft, tiny_tokenizer) -> None:
    cfg = engine_config(block=block, max_requests=3)
    drafter = ARDrafter(tiny_draft, 3, 600)
    gen = Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer, drafter=drafter).generate(PROMPTS, SP)
    assert [o.token_ids for o in gen.outputs] == plain
    assert gen.stats.tau >= 1.0
    assert len(gen.stats.position_acceptance) <= block


@pytest.mark.parametrize("block", list(range(1, 17)))
def test_ngram_greedy_is_lossless(block: int, plain, tiny_target, tiny_tokenizer) -> None:
    cfg = engine_config(block=block, max_requests=2, method="ngram")
    gen = Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer, drafter=NgramDrafter()).generate(PROMPTS, SP)
    assert [o.token_ids for o in gen.outputs] == plain


def test_draft_equal_to_target_accepts_everything(tiny_target, tiny_tokenizer) -> None:
    block = 5
    drafter = ARDrafter(tiny_target, 2, 600)
    eng = Engine(engine_config(block=block, max_requests=2), target=tiny_target, tokenizer=tiny_tokenizer,
                 drafter=drafter)
    for sp in (SamplingParams(max_new_tokens=37, ignore_eos=True),
               SamplingParams(max_new_tokens=37, ignore_eos=True, temperature=0.8, top_k=50, seed=3)):
        stats = eng.generate(PROMPTS[:3], sp).stats
        assert stats.accepted == stats.verified > 0
        assert stats.position_acceptance == [1.0] * block
        # 36 tokens after the prefill token: 6 full rounds of block + 1
        assert stats.tau == pytest.approx(block + 1)
