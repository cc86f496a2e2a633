"""Packed compiled verify steps (modeling/compiled.py `_packed`) and the prefix scheduler priced by their real tokens
(verification/grid_costs.py): a request whose drafts are weak verifies nothing while a neighbour verifies a block."""

from __future__ import annotations

import shutil

import pytest
import torch

from dspark_core.config import ASSETS
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.compiled import CompiledStep
from dspark_core.verification.grid_costs import GridCosts, packed_schedule, probe_grids

needs_cc = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                              reason="torch.compile on a CPU needs a C++ compiler")

# 8 rows on two cores, SmolLM2-135M bf16 (near benchmarks/packed_step.py's figures), in ms
COSTS = GridCosts(low={(8, 1): 29.0, (8, 3): 30.7, (8, 9): 37.2}, full={(8, 1): 29.0, (8, 3): 42.0, (8, 9): 85.7})


def test_a_grid_costs_a_line_in_its_real_tokens_and_learns_its_measured_scale() -> None:
    costs = GridCosts(low=dict(COSTS.low), full=dict(COSTS.full))
    assert costs.seconds((8, 9), 8) == 37.2 and costs.seconds((8, 9), 72) == 85.7
    assert costs.seconds((8, 9), 40) == pytest.approx(37.2 + (85.7 - 37.2) / 2)
    assert costs.seconds((8, 1), 8) == 29.0
    costs.observe((8, 3), 24, 84.0)  # the engine's 8 x 3 steps take twice the probe
    assert costs.seconds((8, 3), 24) == pytest.approx(84.0)
    costs.observe((8, 3), 24, 42.0)  # EMA 0.2
    assert costs.seconds((8, 3), 24) == pytest.approx(42.0 * (0.8 * 2 + 0.2))
    costs.observe((4, 3), 12, 1.0)  # a grid the probes never timed is ignored
    assert (4, 3) not in costs.scale


def test_one_strong_row_verifies_its_block_while_the_weak_ones_verify_nothing() -> None:
    strong, weak = [0.97] * 8, [0.1] * 8
    dec = packed_schedule([strong] + [weak] * 7, COSTS, (1, 3, 9), batch_rows=8)
    assert dec.lengths == [8] + [0] * 7 and dec.batch_tokens == 16
    # the dense grid would have paid 8 x 9 for that block: no T > 1 pays there
    assert packed_schedule([weak] * 8, COSTS, (1, 3, 9), batch_rows=8).lengths == [0] * 8
    # every row strong: the whole grid
    assert packed_schedule([strong] * 8, COSTS, (1, 3, 9), batch_rows=8).lengths == [8] * 8
    # a grid of 3 holds 2 drafts a row: mid-strength rows verify 2 there, not 8 in the 9-grid
    mid = [0.9, 0.85, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    assert packed_schedule([mid] * 8, COSTS, (1, 3, 9), batch_rows=8).lengths == [2] * 8
    assert packed_schedule([], COSTS, (1, 3, 9)).lengths == []


@needs_cc
@pytest.mark.parametrize("pack", [True, False])
def test_a_packed_verify_equals_the_dense_and_eager_ones(pack: bool) -> None:
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v = model.arch.vocab_size
    prompts = torch.randint(0, v, (2, 20))
    eager, comp = model.new_cache(2, 64), model.new_cache(2, 64)
    for cache in (eager, comp):
        model(prompts, cache, [0, 1])
        cache.truncate(1, 15)
    step, n_new = torch.randint(0, v, (2, 5)), [5, 2]  # 2 rows; 7 real tokens of a 2 x 9 grid
    want = model(step, eager, [0, 1], n_new)
    compiled = CompiledStep(model, sizes=(1, 9), pack=pack)
    model.compiled = compiled
    try:
        got = model(step, comp, [0, 1], n_new)
        if pack:  # another count of real tokens in the same grid: the same graph (N is dynamic)
            with torch._dynamo.config.patch(error_on_recompile=True):
                model(torch.randint(0, v, (2, 4)), comp, [0, 1], [1, 4])
            for s, n in enumerate(eager.lens.tolist()):
                comp.truncate(s, n)
    finally:
        model.compiled = None
    assert len(compiled.seen) == 1
    assert (got.pack is not None) == pack and (got.flat_logits.shape[0] == 7) == pack
    for r, n in enumerate(n_new):
        assert torch.allclose(got.row_logits(r)[:n], want.row_logits(r)[:n], atol=1e-4, rtol=1e-4)
    for r, n in enumerate(n_new):  # the greedy tokens at the real positions (a dense step's padding holds its own)
        assert torch.equal(got.argmax()[r, :n], want.argmax()[r, :n])
    assert comp.lens.tolist() == eager.lens.tolist() == [25, 17]
    for layer in range(model.arch.num_hidden_layers):
        for s, n in enumerate(eager.lens.tolist()):
            assert torch.allclose(comp.k[layer][s, :n], eager.k[layer][s, :n], atol=1e-5)


@needs_cc
def test_the_probes_time_each_grid_full_and_at_one_real_token_a_row(tiny_target) -> None:
    tiny_target.compiled = CompiledStep(tiny_target, sizes=(1, 3))
    cache = tiny_target.new_cache(2, 32)
    seen: list[tuple[int, int, int]] = []
    real = tiny_target.forward

    def spy(tokens, cache, slots, n_new=None, **kw):  # noqa: ANN001, ANN202 - the model's own signature
        seen.append((len(slots), tokens.shape[1], sum(n_new or [tokens.shape[1]] * len(slots))))
        return real(tokens, cache, slots, n_new, **kw)

    tiny_target.forward = spy
    try:
        costs = probe_grids(tiny_target, cache, 0, 2, (1, 3), 6, 1, ())
    finally:
        del tiny_target.forward
        tiny_target.compiled = None
    assert set(seen) == {(1, 1, 1), (1, 3, 3), (2, 1, 2), (2, 3, 6), (2, 3, 2)}  # one row: never 1 of 3
    assert set(costs.low) == set(costs.full) == {(1, 1), (1, 3), (2, 1), (2, 3)}
    assert costs.low[(2, 1)] == costs.full[(2, 1)] and costs.low[(1, 3)] == costs.full[(1, 1)]
    assert not cache.lens.any()


def _engine_scheduler():  # noqa: ANN202 - EngineScheduler
    from dspark_core.verification.regulator import GammaRegulator, RegulatorConfig
    from dspark_core.verification.schedulers import make_scheduler
    from dspark_core.verification.verify_scheduler import EngineScheduler, affine_sps

    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=8))
    costs = GridCosts(low=dict(COSTS.low), full=dict(COSTS.full))
    return EngineScheduler(policy=make_scheduler("prefix", sps=affine_sps([(8, 1.0), (72, 3.9)], 72)), regulator=reg,
                           dense_sizes=(1, 3, 9), grid=costs)


def _choose(s, conf: list[float], sampled: bool) -> list[int]:  # noqa: ANN001 - EngineScheduler
    from dspark_core.drafters.base import DraftRequest, Proposal
    from dspark_core.verification.sampling import SamplingParams

    sp = SamplingParams(temperature=0.8 if sampled else 0.0)
    reqs = [DraftRequest(slot=i, tokens=[1, 2, 3], gamma=8, sampling=sp) for i in range(8)]
    confidence = torch.tensor([[c] * 8 for c in conf])
    return s.choose(reqs, Proposal(torch.zeros(8, 8, dtype=torch.long), [8] * 8, confidence=confidence))


def test_the_engine_scheduler_prices_a_packed_round_and_learns_its_grid() -> None:
    s = _engine_scheduler()
    conf = [0.97] + [0.1] * 7
    assert _choose(s, conf, sampled=False) == [8] + [0] * 7  # greedy: each request its own length
    assert s._pred_s == pytest.approx(COSTS.seconds((8, 9), 16))
    s.step_took(8, 9, 200.0, real=16)  # the engine's 8 x 9 steps are far slower than probed: the block stops paying
    assert s.grid is not None and s.grid.scale[(8, 9)] > 3
    assert _choose(s, conf, sampled=False)[1:] == [0] * 7 and _choose(s, conf, sampled=False)[0] <= 2
    s = _engine_scheduler()
    assert _choose(s, conf, sampled=True) == [8] * 8  # sampled, no round before: verify all
    assert _choose(s, [0.1] * 8, sampled=True) == [8] * 8  # decided on the round before's (one strong row: T = 9)
    assert _choose(s, conf, sampled=True) == [0] * 8  # ... and on that round's weak rows
