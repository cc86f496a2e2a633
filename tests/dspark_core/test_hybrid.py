"""The DSpark + suffix hybrid: per request and round the draft with the larger expected accepted length; greedy fp32
outputs token-identical to plain decoding with both proposers used, and sampled outputs following the target."""

from __future__ import annotations

import pytest
import torch
from conftest import engine_config, random_drafter, random_model, sampled_second_token_tv

from dspark_core.drafters.base import Proposal
from dspark_core.drafters.hybrid import HybridDrafter, _expected
from dspark_core.drafters.suffix import SuffixDrafter
from dspark_core.drafters.suffix_tree import expected_accepted
from dspark_core.engine import Engine
from dspark_core.verification.sampling import SamplingParams


def test_expected_accepted_length() -> None:
    conf = torch.tensor([[0.5, 0.5, 0.5], [0.9, 0.1, 1.0]])
    tokens = torch.zeros(2, 3, dtype=torch.long)
    assert _expected(Proposal(tokens, [3, 2], confidence=conf)) == pytest.approx([0.5 + 0.25 + 0.125, 0.9 + 0.09])
    assert _expected(Proposal(tokens, [0, 0], confidence=conf)) == [0.0, 0.0]
    assert _expected(Proposal(tokens, [3, 2])) == [0.0, 0.0]  # no confidences: nothing expected
    assert expected_accepted([]) == 0.0


PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"]


@pytest.mark.parametrize("block", [4, 8])
def test_hybrid_greedy_is_token_identical_to_plain_and_uses_both(block: int, tiny_target, tiny_tokenizer) -> None:
    sp = SamplingParams(max_new_tokens=32, ignore_eos=False)
    plain = Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer).generate(PROMPTS, sp)
    eng = Engine(engine_config(block=block, max_requests=2, method="hybrid"), target=tiny_target,
                 tokenizer=tiny_tokenizer)
    assert isinstance(eng.drafter, HybridDrafter)
    for _ in range(2):  # the second pass can also draft from the first pass's outputs
        gen = eng.generate(PROMPTS, sp)
        assert [o.token_ids for o in gen.outputs] == [o.token_ids for o in plain.outputs]
    assert eng.drafter.stats.suffix > 0 and eng.drafter.stats.model > 0, eng.drafter.stats


def test_hybrid_sampled_output_follows_the_target() -> None:
    target = random_model(5, vocab=6)
    drafter = HybridDrafter(random_drafter(target, block=3), SuffixDrafter(min_prob=0.0))
    tv, gen = sampled_second_token_tv(target, drafter, "hybrid", [1, 2, 3, 1, 2, 3, 1, 2], 1200)
    assert tv < 0.05
    assert drafter.stats.suffix > 0 and drafter.stats.model > 0, drafter.stats
    assert gen.stats.verified > 0 and gen.stats.accepted < gen.stats.verified
