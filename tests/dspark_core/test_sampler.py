"""Rejection sampling reproduces the target distribution (synthetic vocabulary, many samples).

In the spirit of vLLM's rejection-sampler test: for a block of drafted positions the empirical
distribution of the emitted tokens converges to the target's p and not to the draft's q.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.verification.sampling import SamplingParams, sampling_probs
from dspark_core.verification.verify import verify_greedy, verify_greedy_batch, verify_sampling

V = 6  # synthetic vocabulary
N = 20000  # samples per distribution test


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def dists(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(3, V, generator=gen) * 1.5, -1)  # target at 3 positions (2 drafts + bonus)
    q = torch.softmax(torch.randn(2, V, generator=gen) * 1.5, -1)  # draft at 2 positions
    return p, q


@pytest.mark.parametrize("point_mass", [False, True])
def test_emitted_tokens_follow_the_target(point_mass: bool) -> None:
    p, q = dists(1)
    gen = torch.Generator().manual_seed(7)
    first = torch.zeros(V)
    second_given = torch.zeros(V)  # second emitted token, given the first is token x0 (first accepted)
    n_second = 0
    for _ in range(N):
        if point_mass:
            draft = torch.tensor([2, 4])
            qq = None
        else:
            draft = torch.multinomial(q, 1, generator=gen).squeeze(-1)  # [2]
            qq = q
        k, tok = verify_sampling(p, qq, draft, gen)
        emitted = draft[:k].tolist() + [tok]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            n_second += 1
            second_given[emitted[1]] += 1
    first /= N
    assert tv(first, p[0]) < 0.02
    draft_dist = q[0] if not point_mass else torch.nn.functional.one_hot(torch.tensor(2), V).float()
    assert tv(first, draft_dist) > 0.1  # it did not converge to the draft
    # the second token (emitted only when the first was accepted or ... ) follows p[1] as well
    assert n_second > 1000
    assert tv(second_given / n_second, p[1]) < 0.04


def test_identical_draft_is_always_accepted() -> None:
    p, _ = dists(2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        draft = torch.multinomial(p[:2], 1, generator=gen).squeeze(-1)
        k, _ = verify_sampling(p, p[:2], draft, gen)
        assert k == 2


def test_greedy_paths_agree() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 5, V, generator=gen)  # [B, T, V]
    best = logits.argmax(-1)
    draft = best[:, :4].clone()
    draft[0, 2] = (draft[0, 2] + 1) % V  # row 0 diverges at position 2
    num = [4, 4, 1]
    batch = verify_greedy_batch(logits, draft, num)
    for b in range(3):
        assert batch[b] == verify_greedy(logits[b, : num[b] + 1], draft[b, : num[b]])
    assert batch[0] == (2, int(best[0, 2]))
    assert batch[1] == (4, int(best[1, 4]))
    assert batch[2] == (1, int(best[2, 1]))
    # greedy as the special case of rejection sampling with one-hot distributions
    one_hot = sampling_probs(logits[0], SamplingParams(temperature=0.0))
    assert verify_sampling(one_hot, None, draft[0], gen) == batch[0]


def test_sampling_transform_top_k_top_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = sampling_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]))
    p = sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.2 < 0.8 -> keep 3
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    p = sampling_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1))
    assert sampling_probs(logits, SamplingParams()).tolist() == [1.0, 0, 0, 0, 0]


def test_engine_sampling_is_reproducible_per_request_seed() -> None:
    from conftest import engine_config, random_model

    from dspark_core.drafters.ar_draft import ARDrafter
    from dspark_core.engine import Engine

    target, draft = random_model(1), random_model(2)
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        eng = Engine(engine_config(block=3), target=target, drafter=ARDrafter(draft, 4, 600))
        runs.append([o.token_ids for o in eng.generate([[1, 2, 3], [4, 5]], sp).outputs])
    assert runs[0] == runs[1]
    assert all(len(r) == 20 for r in runs[0])


def test_engine_sampled_output_follows_the_target_not_the_draft() -> None:
    """End to end: the marginal of the 2nd generated token equals the target's exact marginal."""
    from conftest import engine_config, random_model

    from dspark_core.drafters.ar_draft import ARDrafter
    from dspark_core.engine import Engine

    vocab, n = 8, 1500
    target, draft = random_model(5, vocab=vocab), random_model(6, vocab=vocab)
    prompt = [1, 2, 3]
    sp = SamplingParams(temperature=1.0, max_new_tokens=3, ignore_eos=True)

    def exact_second(model) -> torch.Tensor:  # noqa: ANN001 - sum_t1 p(t1) p(t2 | t1)
        with torch.no_grad():
            p1 = torch.softmax(model.forward_full(torch.tensor([prompt]))[0][0, -1], -1)
            seqs = torch.tensor([prompt + [t] for t in range(vocab)])
            p2 = torch.softmax(model.forward_full(seqs)[0][:, -1], -1)  # [V, V]
        return p1 @ p2

    eng = Engine(engine_config(block=2, max_requests=64), target=target, drafter=ARDrafter(draft, 64, 64))
    gen = eng.generate([prompt] * n, sp)
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in gen.outputs]), minlength=vocab).float() / n
    want, draft_marginal = exact_second(target), exact_second(draft)
    assert tv(want, draft_marginal) > 0.15  # the test can tell the two apart
    assert tv(counts, want) < 0.05
    assert gen.stats.verified > 0 and gen.stats.accepted < gen.stats.verified  # real rejections happened
