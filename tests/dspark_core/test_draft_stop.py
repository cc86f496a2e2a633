"""Drafting that stops where the scheduler would verify nothing more (grid_costs.survival_floor,
DSparkDraftModel._greedy's `stop`): no draft the packed schedule admits is below the floor, the loop's short block
is the long one's prefix, and an engine drafting short blocks verifies the same tokens, round by round."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import engine_config, random_drafter, random_model

from dspark_core.drafters.base import DraftRequest
from dspark_core.verification.grid_costs import GridCosts, packed_schedule, survival_floor
from dspark_core.verification.sampling import SamplingParams
from dspark_core.verification.schedulers import prefix_survival

SIZES = (1, 3, 5, 9)


def _costs(rng: random.Random, slope: float, low: float = 10.0) -> GridCosts:
    """Grids of 1, 2, 4, 8 rows x SIZES: each a line from one real token a row to every cell, with noise."""
    lo, full = {}, {}
    for b in (1, 2, 4, 8):
        for t in SIZES:
            base = low + 0.5 * b + (0.3 * t if t > 1 else 0.0)
            lo[(b, t)] = base if b > 1 else low + 0.5  # one row's grid starts at its 1-token step
            full[(b, t)] = lo[(b, t)] + slope * (b * t - b) * rng.uniform(0.7, 1.3)
    return GridCosts(low=lo, full=full)


@pytest.mark.parametrize("seed", range(6))
def test_no_draft_the_packed_schedule_admits_is_below_the_floor(seed: int) -> None:
    rng = random.Random(seed)
    checked = 0
    for _ in range(40):
        costs = _costs(rng, slope=rng.choice([0.05, 0.3, 1.0, 3.0]))
        rows = rng.randint(1, 8)
        b = 1 << (rows - 1).bit_length()
        overhead = rng.choice([0.0, 2.0, 8.0])
        conf = [[rng.betavariate(2, 1.5) for _ in range(8)] for _ in range(rows)]
        floor = survival_floor(costs, rows, SIZES, overhead_s=overhead, batch_rows=b)
        dec = packed_schedule(conf, costs, SIZES, overhead_s=overhead, batch_rows=b)
        surv = prefix_survival(conf)
        for r, n in enumerate(dec.lengths):
            if n:
                assert surv[r][n - 1] >= floor
                checked += 1
        # a row's survival scaled up to `boost` times (the scheduler's calibration factor) against the boosted floor
        f = rng.uniform(0.5, 2.0)
        scaled = [[min(0.999, row[0] * f), *row[1:]] for row in conf]
        low = survival_floor(costs, rows, SIZES, overhead_s=overhead, batch_rows=b, boost=2.0)
        for r, n in enumerate(packed_schedule(scaled, costs, SIZES, overhead_s=overhead, batch_rows=b).lengths):
            if n:
                assert surv[r][n - 1] >= low
    assert checked > 0
    # a grid whose extra tokens cost nothing rules nothing out
    flat = GridCosts(low={(1, 1): 1.0, (1, 3): 1.0}, full={(1, 1): 1.0, (1, 3): 1.0})
    assert survival_floor(flat, 1, (1, 3)) == 0.0
    assert survival_floor(flat, 1, (1,)) == 0.0


def _primed(target, drafter, prompts: dict[int, list[int]]) -> None:  # noqa: ANN001
    with torch.inference_mode():
        for slot, p in prompts.items():
            _, hidden = target.forward_full(torch.tensor([p[:-1]]), hidden_layers=drafter.hidden_layers)
            drafter.reset(slot, p[:-1], hidden[0])


def test_a_stopped_block_is_the_whole_blocks_prefix() -> None:
    target = random_model(11, vocab=48)
    drafter = random_drafter(target, block=8)
    prompts = {0: [1, 2, 3, 4, 1, 2, 3, 4, 1], 1: [40, 41, 42, 7, 7], 2: [9, 8, 7]}
    _primed(target, drafter, prompts)
    reqs = [DraftRequest(slot=s, tokens=p, gamma=8, sampling=SamplingParams()) for s, p in prompts.items()]
    whole = drafter.propose(reqs)
    assert whole.confidence is not None and whole.num == [8, 8, 8]
    top = whole.confidence.cumprod(-1).max(0).values  # [8] the best row's survival per position
    assert bool((top[1:] < top[:-1]).all())
    drafter.stop_below = float(top[2] + top[3]) / 2  # every row below it from the 4th draft on
    short = drafter.propose(reqs)
    assert short.num == [4, 4, 4]
    assert torch.equal(short.tokens[:, :4], whole.tokens[:, :4]) and not short.tokens[:, 4:].any()
    assert short.confidence is not None
    assert torch.allclose(short.confidence[:, :4], whole.confidence[:, :4], atol=1e-6)
    drafter.stop_below = float(top[0]) * 2  # below the floor from the first draft: one drafted, never none
    assert drafter.propose(reqs).num == [1, 1, 1]
    drafter.stop_below = 0.0
    assert drafter.propose(reqs).num == [8, 8, 8]


def _scheduler(costs: GridCosts):  # noqa: ANN202 - EngineScheduler
    from dspark_core.verification.regulator import GammaRegulator, RegulatorConfig
    from dspark_core.verification.schedulers import make_scheduler
    from dspark_core.verification.verify_scheduler import EngineScheduler, affine_sps

    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=8, adaptive=False))
    sch = EngineScheduler(policy=make_scheduler("prefix", sps=affine_sps([(4, 1.0), (36, 2.0)], 36)), regulator=reg,
                          dense_sizes=SIZES, grid=costs, learn_overhead=False)
    sch.step_took = lambda *a, **k: None  # type: ignore[method-assign]  # prices fixed: decisions repeatable
    return sch


def test_an_engine_drafting_to_the_floor_verifies_what_it_verified_drafting_whole_blocks() -> None:
    from dspark_core.engine import Engine

    target = random_model(11, vocab=48)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 40, 41, 7, 8], [20, 21, 22], [5, 5, 6, 6, 5, 5]]
    sp = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = Engine(engine_config(method="plain"), target=target).generate(prompts, sp)
    runs = []
    for stop in (True, False):
        drafter = random_drafter(target, block=8)
        with torch.no_grad():
            drafter.model.confidence.proj.weight.mul_(0.1)  # weak drafts (c ~ 0.5): survival falls below the
            drafter.model.confidence.proj.bias.fill_(-0.3)  # floor mid-block
        sch = _scheduler(_costs(random.Random(3), slope=1.0))
        if not stop:
            sch.draft_floor = lambda requests: 0.0  # type: ignore[method-assign]
        seen: list[tuple[list[int], list[int], list[int]]] = []  # per round: (asked, drafted, verified)
        choose = sch.choose

        def spy(requests, proposal, choose=choose, seen=seen):  # noqa: ANN001, ANN202
            lengths = choose(requests, proposal)
            seen.append(([r.gamma for r in requests], list(proposal.num), list(lengths)))
            return lengths

        sch.choose = spy  # type: ignore[method-assign]
        gen = Engine(engine_config(block=8, method="dspark"), target=target, drafter=drafter,
                     scheduler=sch).generate(prompts, sp)
        runs.append((gen, seen))
    (short, seen_s), (whole, seen_w) = runs
    assert [o.token_ids for o in short.outputs] == [o.token_ids for o in whole.outputs] \
        == [o.token_ids for o in plain.outputs]
    assert [v for _, _, v in seen_s] == [v for _, _, v in seen_w]  # the same drafts verified, round by round
    assert any(d != a for a, d, _ in seen_s) and all(d == a for a, d, _ in seen_w)
    assert short.stats.verified > 0
