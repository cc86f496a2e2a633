"""Losslessness of the schedulers, simulated through the whole round: sample drafts, compute
prefix-dependent confidences, schedule, verify by rejection sampling, count output tokens.

The first test is the DSpark paper's Appendix A counterexample; the second a random multi-request
Markov world; the third the greedy (argmax) case for every block length 1..16.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from dspark_core.verification.learned import FEATURES, LearnedScheduler, PolicyFile, RoundContext
from dspark_core.verification.schedulers import AsyncTopKScheduler, Scheduler, make_scheduler, prefix_schedule
from dspark_core.verification.sps import SpsTable

Dist = Sequence[float]


def _scheduler(name: str, sps: SpsTable, threshold: float) -> Scheduler:
    """make_scheduler, plus `learned`: Algorithm 1 on a fixed acceptance model that sharpens the confidence and
    reads the position and the request's history (its estimate for j reads c_j, which the Markov confidence
    computes from x_<j)."""
    if name != "learned":
        return make_scheduler(name, sps=sps, threshold=threshold)
    n = len(FEATURES)
    w = [0.0] * n
    w[FEATURES.index("confidence_logit")], w[FEATURES.index("position")] = 1.5, -0.5
    w[FEATURES.index("recent_acceptance")] = 0.3
    policy = PolicyFile(features=list(FEATURES), mean=[0.0] * n, scale=[1.0] * n, weights=w, shift=0.2, gamma=16)
    return LearnedScheduler(policy=policy, sps=sps, context=RoundContext(recent_acceptance=[0.6, 0.2]))


def _sample(rng: random.Random, p: Dist) -> int:
    return rng.choices(range(len(p)), weights=p)[0]


def _verify(rng: random.Random, drafts: list[int], q: list[Dist], target: Callable[[int], Dist],
            last: int, n_verify: int) -> list[int]:
    """Standard speculative sampling over the first n_verify drafts; returns the emitted tokens."""
    out: list[int] = []
    for k in range(n_verify):
        p = target(last)
        x = drafts[k]
        if rng.random() < min(1.0, p[x] / q[k][x]):
            out.append(x)
            last = x
            continue
        resid = [max(0.0, pi - qi) for pi, qi in zip(p, q[k], strict=True)]
        out.append(_sample(rng, resid))
        return out
    out.append(_sample(rng, target(last)))  # bonus token
    return out


# --- Appendix A -----------------------------------------------------------------------------------

P_T = (0.7, 0.3)  # target over {A, B}
P_D = (0.5, 0.5)  # draft over {A, B}
APPENDIX_SPS = SpsTable.from_probes([(1, 1.0), (2, 0.5), (3, 0.45)])


def _appendix_a_first_token(scheduler: Callable[[list[list[float]]], list[int]], n: int, seed: int) -> float:
    """P(first output token = A) under the full pipeline with the paper's numbers."""
    rng = random.Random(seed)
    count_a = 0
    for _ in range(n):
        x1, x2 = _sample(rng, P_D), _sample(rng, P_D)
        c2 = 0.9 if x1 == 0 else 0.0  # the Markov confidence head sees x1
        (n_verify,) = scheduler([[0.8, c2]])
        out = _verify(rng, [x1, x2], [P_D, P_D], lambda _last: P_T, last=-1, n_verify=n_verify)
        count_a += out[0] == 0
    return count_a / n


@pytest.mark.parametrize("name,expected", [
    ("prefix_without_early_stop", 0.85),  # the biased retrospective search of Appendix A
    ("prefix", 0.7),
    ("async_topk", 0.7),
    ("threshold", 0.7),
    ("verify_all", 0.7),
    ("learned", 0.7),
])
def test_appendix_a_counterexample(name: str, expected: float) -> None:
    if name == "prefix_without_early_stop":
        def sched(rows: list[list[float]]) -> list[int]:
            return prefix_schedule(rows, APPENDIX_SPS, early_stop=False).lengths
    else:
        sched = _scheduler(name, APPENDIX_SPS, 0.75).schedule
    n = 20_000
    p_a = _appendix_a_first_token(sched, n, seed=11)
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(p_a - expected) < 5 * sigma, f"{name}: P(A) = {p_a:.4f}, expected {expected}"


# --- random multi-request Markov world --------------------------------------------------------------

V, GAMMA, N_OUT, START = 3, 3, 3, 3  # vocab, block length, tokens generated per request, start token id


def _rand_dist(rng: random.Random, sharp: float) -> list[float]:
    w = [rng.random() ** sharp for _ in range(V)]
    s = sum(w)
    return [x / s for x in w]


def _world(seed: int) -> tuple[list[list[float]], list[list[list[float]]], list[list[float]]]:
    rng = random.Random(seed)
    target = [_rand_dist(rng, 2.0) for _ in range(V + 1)]  # p_t(. | previous token)
    draft = [[_rand_dist(rng, 1.0) for _ in range(V + 1)] for _ in range(GAMMA)]  # p_d,k(. | previous)
    conf = [[rng.choice([0.02, 0.6, 0.98]) for _ in range(V + 1)] for _ in range(GAMMA)]  # c_k(previous)
    return target, draft, conf


# A cost curve with a cliff then a plateau (not unimodal): where a search without the early stop differs.
WORLD_SPS = SpsTable.from_probes([(1, 1.0), (2, 0.5), (3, 0.45), (4, 0.44), (5, 0.3), (8, 0.29)])


def _simulate(scheduler_name: str, n: int, seed: int,
              block: Callable[[list[list[int]]], int] | None = None) -> tuple[Counter, Counter]:
    """`block`: the round's block length from the committed outputs (default: always GAMMA)."""
    target, draft, conf = _world(seed=5)
    if scheduler_name == "prefix_without_early_stop":
        def schedule(rows: list[list[float]]) -> list[int]:
            return prefix_schedule(rows, WORLD_SPS, early_stop=False).lengths
    elif scheduler_name == "prefix_overhead":  # the engine's variant: a per-round overhead on every step
        def schedule(rows: list[list[float]]) -> list[int]:
            return prefix_schedule(rows, WORLD_SPS, overhead_s=0.3).lengths
    else:
        schedule = _scheduler(scheduler_name, WORLD_SPS, 0.4).schedule
    rng = random.Random(seed)
    counts = (Counter(), Counter())
    for _ in range(n):
        outs: list[list[int]] = [[], []]
        while any(len(o) < N_OUT for o in outs):
            active = [r for r in range(2) if len(outs[r]) < N_OUT]
            drafts, qs, rows = [], [], []
            g = block([outs[r] for r in active]) if block is not None else GAMMA
            for r in active:
                prev = outs[r][-1] if outs[r] else START
                xs, q, cs = [], [], []
                for k in range(g):
                    cs.append(conf[k][prev])
                    q.append(draft[k][prev])
                    prev = _sample(rng, draft[k][prev])
                    xs.append(prev)
                drafts.append(xs)
                qs.append(q)
                rows.append(cs)
            lengths = schedule(rows)
            for i, r in enumerate(active):
                last = outs[r][-1] if outs[r] else START
                outs[r].extend(_verify(rng, drafts[i], qs[i], lambda t: target[t], last, lengths[i]))
        for r in range(2):
            counts[r][tuple(outs[r][:N_OUT])] += 1
    return counts


def _exact(target: list[list[float]]) -> dict[tuple[int, ...], float]:
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(N_OUT):
        probs = {seq + (v,): p * target[seq[-1] if seq else START][v]
                 for seq, p in probs.items() for v in range(V)}
    return probs


def _worst_deviation(name: str, n: int, block: Callable[[list[list[int]]], int] | None = None) -> tuple[float, str]:
    """Largest deviation of an output-sequence frequency from the target, in standard errors."""
    counts = _simulate(name, n, seed=21, block=block)
    worst, where = 0.0, ""
    for r in range(2):
        for seq, p in _exact(_world(seed=5)[0]).items():
            f = counts[r][seq] / n
            # the 5e-4 slack absorbs outcomes of ~0 probability, where the normal approximation fails
            z = max(0.0, abs(f - p) - 5e-4) / math.sqrt(p * (1 - p) / n)
            if z > worst:
                worst, where = z, f"request {r} {seq}: {f:.4f} vs {p:.4f}"
    return worst, where


@pytest.mark.parametrize("name", ["verify_all", "threshold", "prefix", "async_topk", "prefix_overhead", "learned"])
def test_sampled_outputs_follow_the_target_with_two_requests(name: str) -> None:
    z, where = _worst_deviation(name, 20_000)
    assert z < 4.5, f"{name}: {where}"


def test_a_learned_block_length_keeps_the_target_distribution() -> None:
    """The learned gamma policy picks each round's block (0 = plain step .. GAMMA) from the committed text; whatever
    it picks, the sampled outputs follow the target."""
    from dspark_core.verification.gamma_policy import (
        COST_TERMS,
        GAMMA_FEATURES,
        GammaPolicyFile,
        TokenClasses,
        choose_blocks,
        text_features,
    )

    # acceptance rises with the share of token 0 ("symbol") in the recent text, so the block follows the text
    policy = GammaPolicyFile(features=list(GAMMA_FEATURES), mean=[0.0] * 6, scale=[1.0] * 6,
                             weights=[-2.0, 0.0, 0.0, 0.0, 0.0, 6.0], cost_terms=list(COST_TERMS),
                             cost=[0.0, 0.0, 0.0, 0.2, 0.0, 0.1, 0.0], gamma_max=GAMMA)  # draft 0.2 + 0.1 / position
    classes = TokenClasses(newline=frozenset(), symbol=frozenset({0}))
    picked: Counter = Counter()

    def block(outs: list[list[int]]) -> int:
        surv = [policy.survival(0.5, text_features([START, *o], classes), GAMMA) for o in outs]
        g = max(choose_blocks(policy, WORLD_SPS, surv, [GAMMA] * len(outs), GAMMA))
        picked[g] += 1
        return g

    z, where = _worst_deviation("verify_all", 20_000, block)
    assert z < 4.5, where
    assert len(picked) >= 2, picked  # the block did change with the text


def test_the_random_world_detects_the_retrospective_search() -> None:
    """Power check: the same statistic flags the search without the early stop as biased."""
    z, _ = _worst_deviation("prefix_without_early_stop", 20_000)
    assert z > 4.5


# --- greedy: token-identical to plain decoding ------------------------------------------------------

def _greedy_target(ctx: Sequence[int]) -> int:
    """A deterministic toy target: next token from a hash of the last three tokens (vocab 50)."""
    h = 1469598103934665603
    for t in ctx[-3:]:
        h = ((h ^ t) * 1099511628211) % (1 << 61)
    return h % 50


@pytest.mark.parametrize("name", ["verify_all", "threshold", "prefix", "async_topk", "learned"])
def test_greedy_outputs_identical_to_plain_for_every_block_length(name: str) -> None:
    rng = random.Random(0)
    sps = SpsTable.from_probes([(1, 1.0), (8, 0.9), (16, 0.6), (32, 0.3), (64, 0.2)], 256)
    for gamma in range(1, 17):
        sched = _scheduler(name, sps, 0.3)
        prompts = [[rng.randrange(50) for _ in range(rng.randint(1, 6))] for _ in range(5)]
        n_new = [rng.randint(1, 40) for _ in prompts]  # mixed lengths: requests finish at different rounds
        plain = []
        for p, m in zip(prompts, n_new, strict=True):
            seq = list(p)
            for _ in range(m):
                seq.append(_greedy_target(seq))
            plain.append(seq)
        seqs = [list(p) for p in prompts]
        while True:
            active = [r for r in range(len(seqs)) if len(seqs[r]) < len(prompts[r]) + n_new[r]]
            if not active:
                break
            drafts, rows = [], []
            for r in active:
                ctx, xs, cs = list(seqs[r]), [], []
                for _ in range(gamma):  # a draft that is right ~70% of the time
                    t = _greedy_target(ctx)
                    x = t if rng.random() < 0.7 else rng.randrange(50)
                    xs.append(x)
                    ctx.append(x)
                    cs.append(rng.random())
                drafts.append(xs)
                rows.append(cs)
            for r, xs, n_ver in zip(active, drafts, sched.schedule(rows), strict=True):
                assert 0 <= n_ver <= gamma
                for x in xs[:n_ver]:  # greedy acceptance: draft == target argmax
                    t = _greedy_target(seqs[r])
                    seqs[r].append(t)
                    if x != t:
                        break
                else:
                    seqs[r].append(_greedy_target(seqs[r]))
                del seqs[r][len(prompts[r]) + n_new[r]:]
        assert seqs == plain, f"{name} gamma={gamma}"


def test_async_topk_history_does_not_leak_between_resets() -> None:
    sched = AsyncTopKScheduler(sps=APPENDIX_SPS)
    for _ in range(3):
        sched.schedule([[0.8, 0.9]])
    sched.reset()
    assert len(sched.history) == 0 and sched.last_capacity is None
