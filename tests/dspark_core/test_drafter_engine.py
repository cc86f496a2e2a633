"""The DSpark drafter and the schedulers inside the engine's round loop (random small models): greedy
output identical to plain decoding for every head x scheduler, block lengths 1..16, mixed batches."""

from __future__ import annotations

import pytest
import torch
from conftest import engine_config, random_drafter, random_model

from dspark_core.engine import Engine
from dspark_core.verification.sampling import SamplingParams
from dspark_core.verification.sps import SpsTable
from dspark_core.verification.verify_scheduler import build_verify_scheduler

PROMPTS = [[1, 2, 3, 4, 5], [7], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6]]
SP = SamplingParams(max_new_tokens=20, ignore_eos=True)
SPS = SpsTable.from_probes([(1, 1.0), (4, 0.95), (8, 0.7), (16, 0.5), (32, 0.3)], 256)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)  # tiny matmuls: threads only contend on the shared CI cores
    return random_model(11)


@pytest.fixture(scope="module")
def plain(target) -> list[list[int]]:
    eng = Engine(engine_config(method="plain"), target=target)
    return [o.token_ids for o in eng.generate(PROMPTS, SP).outputs]


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
@pytest.mark.parametrize("scheduler", ["verify_all", "threshold", "prefix", "async_topk"])
def test_greedy_is_lossless_for_every_head_and_scheduler(head: str, scheduler: str, target, plain) -> None:
    for block in range(1, 17) if head == "markov" else (1, 3, 8, 16):
        cfg = engine_config(block=block, max_requests=3, method="dspark")
        cfg.spec.head = head  # type: ignore[assignment]
        cfg.spec.scheduler = scheduler  # type: ignore[assignment]
        cfg.spec.confidence_threshold = 0.3
        sched = build_verify_scheduler(cfg, target, sps=SPS)
        eng = Engine(cfg, target=target, drafter=random_drafter(target, head), scheduler=sched)
        gen = eng.generate(PROMPTS, SP)
        assert [o.token_ids for o in gen.outputs] == plain, f"{head}/{scheduler} block {block}"
        assert gen.stats.tau >= 1.0


def test_sampling_runs_are_reproducible_and_carry_confidences(target) -> None:
    cfg = engine_config(block=4, max_requests=2, method="dspark")
    sp = SamplingParams(max_new_tokens=16, ignore_eos=True, temperature=0.9, top_k=20, seed=4)
    runs = []
    for _ in range(2):
        drafter = random_drafter(target, "markov")
        eng = Engine(cfg, target=target, drafter=drafter,
                     scheduler=build_verify_scheduler(cfg, target, sps=SPS))
        runs.append([o.token_ids for o in eng.generate(PROMPTS, sp).outputs])
    assert runs[0] == runs[1] and all(len(t) == 16 for t in runs[0])


def test_proposal_shapes_and_calibrated_confidence(target) -> None:
    from dspark_core.drafters.base import DraftRequest
    from dspark_core.verification.calibrate import StsCalibration

    d = random_drafter(target, "rnn")
    hidden = torch.randn(6, d.model.cfg.context_width)
    d.reset(0, [1, 2, 3, 4, 5, 6], hidden)
    d.reset(1, [1, 2], hidden[:2])
    reqs = [DraftRequest(slot=0, tokens=[1, 2, 3, 4, 5, 6, 7], gamma=3, sampling=SamplingParams()),
            DraftRequest(slot=1, tokens=[1, 2, 8], gamma=0, sampling=SamplingParams())]
    prop = d.propose(reqs)
    assert prop.tokens.shape == (2, 3) and prop.num == [3, 0] and prop.probs is None
    assert prop.confidence is not None and bool(((prop.confidence[0] > 0) & (prop.confidence[0] < 1)).all())
    d.sts = StsCalibration(temperatures=[100.0, 100.0, 100.0])  # huge T: every confidence -> 0.5
    prop2 = d.propose(reqs)
    assert torch.equal(prop2.tokens, prop.tokens)
    torch.testing.assert_close(prop2.confidence[0], torch.full((3,), 0.5), atol=0.05, rtol=0)


def test_full_batch_rounds_are_counted_apart_from_the_closed_batchs_tail(target) -> None:
    """Four prompts on three slots: the rounds after the first request ends run two or fewer requests, so the tokens of
    full-batch rounds are fewer than all rounds' (bench's full_batch_tokens_per_s, a server's speed under load)."""
    gen = Engine(engine_config(method="plain", max_requests=3), target=target).generate(
        PROMPTS, SamplingParams(max_new_tokens=8, ignore_eos=True))
    st = gen.stats
    assert 0 < st.full_tokens < st.round_tokens and 0 < st.full_s < st.decode_s
    one = Engine(engine_config(method="plain", max_requests=1), target=target).generate(PROMPTS[:1], SP).stats
    assert one.full_tokens == one.round_tokens and one.full_s == one.decode_s
