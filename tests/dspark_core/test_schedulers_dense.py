"""The prefix scheduler on a compiled (dense) step: the tokens per row are chosen among the step sizes, every request
verifies what the padding computes anyway, and a sampled batch decides on the previous round's confidences."""

from __future__ import annotations

import pytest
import torch

from dspark_core.config import EngineConfig
from dspark_core.drafters.base import DraftRequest, Proposal
from dspark_core.engine_parts import step_sizes
from dspark_core.verification.regulator import GammaRegulator, RegulatorConfig
from dspark_core.verification.sampling import SamplingParams
from dspark_core.verification.schedulers import padded_schedule
from dspark_core.verification.sps import SpsTable
from dspark_core.verification.verify_scheduler import EngineScheduler, affine_sps, make_scheduler

# 8 rows on two cores (RESULTS.md): a step costs ~0.64 + 0.045 x tokens plain-step units
LINE = affine_sps([(8, 1.0), (72, 3.9)], 72)


def test_the_step_size_follows_the_confidences() -> None:
    low = [[0.2] * 8 for _ in range(8)]
    high = [[0.95] * 8 for _ in range(8)]
    mid = [[0.9, 0.85, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1] for _ in range(8)]
    assert padded_schedule(low, LINE, (1, 3, 9)).lengths == [0] * 8  # plain beats every verify
    assert padded_schedule(high, LINE, (1, 3, 9)).lengths == [8] * 8
    got = padded_schedule(mid, LINE, (1, 3, 9))
    assert got.lengths == [2] * 8 and got.batch_tokens == 24
    ragged = padded_schedule([[0.95] * 8, [0.95], []], LINE, (1, 3, 9), batch_rows=4)
    # 4 padded rows: T = 3 (12 tokens, tau 5.8) beats T = 9 (36 tokens, tau 10.2 at 1.9x the cost)
    assert ragged.lengths == [2, 1, 0] and ragged.batch_tokens == 12


def _scheduler(sizes: tuple[int, ...]) -> EngineScheduler:
    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=8))
    return EngineScheduler(policy=make_scheduler("prefix", sps=LINE), regulator=reg, dense_sizes=sizes,
                           learn_overhead=False)


def _round(s: EngineScheduler, conf: float, sampled: bool) -> list[int]:
    sp = SamplingParams(temperature=0.8 if sampled else 0.0)
    reqs = [DraftRequest(slot=i, tokens=[1, 2, 3], gamma=8, sampling=sp) for i in range(8)]
    prop = Proposal(torch.zeros(8, 8, dtype=torch.long), [8] * 8, confidence=torch.full((8, 8), conf))
    return s.choose(reqs, prop)


def test_a_greedy_batch_decides_now_a_sampled_one_on_the_round_before() -> None:
    s = _scheduler((1, 3, 9))
    assert _round(s, 0.2, sampled=False) == [0] * 8 and _round(s, 0.97, sampled=False) == [8] * 8
    s = _scheduler((1, 3, 9))
    assert _round(s, 0.2, sampled=True) == [8] * 8  # no round before: verify all
    assert _round(s, 0.97, sampled=True) == [0] * 8  # decided on the low confidences of the round before
    assert _round(s, 0.2, sampled=True) == [8] * 8


def test_a_shape_the_engine_has_run_is_priced_by_its_measured_step() -> None:
    """The probes priced an 8 x 3 step at 1.73x an 8 x 1 one; once the engine's own 8 x 3 steps take 2.5x, drafts of
    confidence 0.6 (0.96 expected extra tokens a row) no longer pay for it. 5 rows x 2 tokens run as 8 x 3."""
    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=8))
    s = EngineScheduler(policy=make_scheduler("prefix", sps=LINE), regulator=reg, dense_sizes=(1, 3, 9))
    assert _round(s, 0.6, sampled=False) == [2] * 8
    s.step_took(8, 1, 1.0)
    s.step_took(5, 2, 2.5)
    assert s.step_s == {8: 1.0, 24: 2.5}
    assert _round(s, 0.6, sampled=False) == [0] * 8
    s.step_took(8, 3, 1.5)  # later steps at that shape move the estimate (EMA 0.2): 2.3, still too slow
    assert s.step_s[24] == pytest.approx(2.3) and _round(s, 0.6, sampled=False) == [0] * 8
    assert _round(s, 0.9, sampled=False) == [8] * 8  # 8 x 9, never run, keeps the probe's price: and pays


@pytest.mark.parametrize(("scheduler", "want"), [("prefix", (1, 3, 5, 9)), ("verify_all", (1, 9))])
def test_the_engine_compiles_a_short_verify_where_a_scheduler_can_choose_it(scheduler: str, want: tuple) -> None:
    cfg = EngineConfig()
    cfg.spec.block_size, cfg.spec.scheduler, cfg.drafter.method = 8, scheduler, "suffix"
    assert step_sizes(cfg) == want
    cfg.spec.block_size = 4  # no short size at or past the full verify
    assert step_sizes(cfg) == ((1, 3, 5) if scheduler == "prefix" else (1, 5))
    cfg.spec.block_size = 8
    cfg.spec.enabled = False
    assert step_sizes(cfg) == (1,)


def test_dense_probes_are_the_padded_step_shapes(tiny_target) -> None:
    """A compiled target's SPS table times each dense shape itself, not a line through a few."""
    from dspark_core.verification.verify_scheduler import profile_target_sps

    seen: list[tuple[int, int]] = []
    real = tiny_target.forward

    def spy(tokens, cache, slots, n_new=None, **kw):  # noqa: ANN001, ANN202 - the model's own signature
        seen.append((len(slots), tokens.shape[1]))
        return real(tokens, cache, slots, n_new, **kw)

    tiny_target.forward = spy
    try:
        sps = profile_target_sps(tiny_target, 54, rows=6, affine=True, dense=(1, 3, 9), repeats=1)
    finally:
        del tiny_target.forward
    timed = {s for s in seen if s[1] != 64}  # not the 64-token context prefills
    # every shape the engine can run: 6 rows pad to 8, and as requests finish 4, 2, 1; 8 x 9 = 72 is past the budget
    assert timed == {(b, t) for b in (1, 2, 4, 8) for t in (1, 3, 9)} - {(8, 9)}
    assert isinstance(sps, SpsTable)
    assert set(sps.sample_batch_tokens) == {1, 2, 3, 4, 6, 8, 9, 12, 18, 24, 36}  # each shape's own time
    assert list(sps.sample_steps_per_sec) == sorted(sps.sample_steps_per_sec, reverse=True)


def test_dense_probes_run_on_the_engines_idle_cache(tiny_target) -> None:
    """Given the engine's idle cache and its drafter's layers, the probes run on them (the engine's own compiled
    graphs) and leave the cache empty; a cache holding a request is left alone (a scratch cache is probed)."""
    from dspark_core.verification.verify_scheduler import profile_target_sps

    seen: list[tuple[object, tuple[int, ...]]] = []
    real = tiny_target.forward

    def spy(tokens, cache, slots, n_new=None, hidden_layers=(), **kw):  # noqa: ANN001, ANN202
        seen.append((cache, tuple(hidden_layers)))
        return real(tokens, cache, slots, n_new, hidden_layers=hidden_layers, **kw)

    own = tiny_target.new_cache(4, 256)
    tiny_target.forward = spy
    try:
        profile_target_sps(tiny_target, 36, rows=4, dense=(1, 3, 9), repeats=1, cache=own, hidden_layers=(0, 1))
        probed = [c for c, h in seen if h == (0, 1)]
        assert probed and all(c is own for c, _ in seen)
        assert not own.lens.any()
        seen.clear()
        own.lens[2] = 5  # a request holds slot 2
        profile_target_sps(tiny_target, 36, rows=4, dense=(1, 3, 9), repeats=1, cache=own, hidden_layers=(0, 1))
        assert seen and all(c is not own and h == () for c, h in seen)
        assert int(own.lens[2]) == 5
    finally:
        del tiny_target.forward


def test_a_proposer_whose_drafts_fail_is_trusted_less_and_one_that_beats_its_estimate_more() -> None:
    """Drafts of confidence 0.6 buy a 3-token step (0.96 expected extra a row); when a round of them is all
    rejected, that proposer's factor falls to (0 + 8) / (7.68 + 8) and the next batch stays on 1-token steps.
    Another proposer's rows keep their own calibration (the hybrid names each row's proposer)."""
    from dspark_core.drafters.base import RoundResult

    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=8))
    s = EngineScheduler(policy=make_scheduler("prefix", sps=LINE), regulator=reg, dense_sizes=(1, 3, 9))
    assert _round(s, 0.6, sampled=False) == [2] * 8
    s.observe([RoundResult(slot=i, proposed=8, verified=2, accepted=0, new_tokens=[5]) for i in range(8)])
    assert s.factor("") == pytest.approx(8 / (8 + 8 * 0.96)) and s.factor("dspark") == 1.0
    assert _round(s, 0.6, sampled=False) == [0] * 8
    s.observe([RoundResult(slot=i, proposed=8, verified=0, accepted=0, new_tokens=[5]) for i in range(8)])
    assert s.factor("") == pytest.approx(8 / (8 + 8 * 0.96))  # a round that verified nothing: no change

    sp = SamplingParams(temperature=0.0)
    reqs = [DraftRequest(slot=i, tokens=[1, 2, 3], gamma=8, sampling=sp) for i in range(8)]
    mixed = Proposal(torch.zeros(8, 8, dtype=torch.long), [8] * 8, confidence=torch.full((8, 8), 0.6),
                     source=["dspark"] * 8)
    assert s.choose(reqs, mixed) == [2] * 8  # dspark's rows: as calibrated
    s.observe([RoundResult(slot=i, proposed=8, verified=2, accepted=2, new_tokens=[5, 6, 7]) for i in range(8)])
    assert s.factor("dspark") == pytest.approx((16 + 8) / (8 * 0.96 + 8)) and s.factor("") < 1.0
