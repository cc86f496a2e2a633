"""The committed tiny DSpark drafters on the committed tiny target: load through the engine's registry,
greedy output identical to plain decoding under every scheduler, drafts accepted, STS shipped."""

from __future__ import annotations

import pytest
from conftest import engine_config

from dspark_core.config import ASSETS
from dspark_core.engine import Engine
from dspark_core.verification.calibrate import StsCalibration
from dspark_core.verification.sampling import SamplingParams

PROMPTS = [
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    if i % 2 == 0:\n",
    "    return self._",
]
SP = SamplingParams(max_new_tokens=24)


@pytest.fixture(scope="module")
def plain(tiny_target, tiny_tokenizer) -> list[list[int]]:
    eng = Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer)
    return [o.token_ids for o in eng.generate(PROMPTS, SP).outputs]


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
def test_committed_drafter_ships_a_calibration(head: str) -> None:
    cal = StsCalibration.load(ASSETS / "drafters" / head / "sts.json")
    assert cal.gamma == 16 and cal.num_samples > 0
    assert sum(cal.ece_after) < sum(cal.ece_before)


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
@pytest.mark.parametrize("scheduler", ["verify_all", "prefix"])
def test_committed_drafter_is_lossless_and_accepts(head: str, scheduler: str, plain, tiny_target,
                                                   tiny_tokenizer) -> None:
    cfg = engine_config(block=8, max_requests=3, method="dspark")
    cfg.spec.head = head  # type: ignore[assignment]
    cfg.spec.scheduler = scheduler  # type: ignore[assignment]
    eng = Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer)  # drafter + SPS profiled at start
    assert eng.drafter is not None and eng.drafter.name == {"none": "dflash"}.get(head, f"dspark_{head}")
    gen = eng.generate(PROMPTS, SP)
    assert [o.token_ids for o in gen.outputs] == plain
    assert gen.stats.tau > 1.0 and gen.stats.accepted > 0


def test_committed_drafter_sampling_is_reproducible(tiny_target, tiny_tokenizer) -> None:
    cfg = engine_config(block=6, max_requests=2, method="dspark")
    sp = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.95, seed=1, ignore_eos=True)
    runs = [[o.token_ids for o in Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer)
             .generate(PROMPTS[:2], sp).outputs] for _ in range(2)]
    assert runs[0] == runs[1] and all(len(t) == 16 for t in runs[0])


def test_adaptive_gamma_moves_blocks_and_stays_lossless(plain, tiny_target, tiny_tokenizer) -> None:
    fixed, adaptive = (engine_config(block=12, max_requests=3, method="dspark") for _ in range(2))
    adaptive.spec.adaptive_gamma = True
    gens = [Engine(c, target=tiny_target, tokenizer=tiny_tokenizer).generate(PROMPTS, SP) for c in (fixed, adaptive)]
    assert all([o.token_ids for o in g.outputs] == plain for g in gens)
    # the regulator shrinks blocks whose tail is rejected: fewer tokens proposed per speculative round
    per_round = [g.stats.proposed / g.stats.rounds for g in gens]
    assert per_round[1] < per_round[0]
