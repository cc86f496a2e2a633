"""Verification kernel vs its torch reference: exact accept lengths, same tokens / same distribution."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels.verify import make_inputs, verify, verify_torch

CFG = {"BLOCK_V": 512, "num_warps": 4, "num_stages": 2, "SPLIT": 1}  # the one-launch kernel
SAMPLE_CFGS = [CFG, {**CFG, "SPLIT": 2}, {**CFG, "SPLIT": 4}]  # vocabulary split over 2 / 4 programs
# ROWS: target rows reduced per pass (one-launch kernel); SPLIT > 1: the two-launch small-batch variant
GREEDY_CFGS = [{**CFG, "ROWS": r} for r in (1, 2, 4)] + [{**CFG, "ROWS": 1, "SPLIT": s} for s in (2, 4)]
# ragged: vocab not a multiple of the block (and smaller / larger than one block), odd batch and gamma
SHAPES = [{"batch": 3, "gamma": 1, "vocab": 17}, {"batch": 5, "gamma": 4, "vocab": 600},
          {"batch": 6, "gamma": 7, "vocab": 1031}]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cfg", GREEDY_CFGS)
def test_greedy_matches_reference(shape: dict[str, int], dtype: torch.dtype, cfg: dict[str, int]) -> None:
    inp = make_inputs(shape, "cpu", seed=shape["vocab"], greedy=True, dtype=dtype)
    ref = verify(**inp, backend="torch")
    out = verify(**inp, backend="triton", config=cfg)
    assert torch.equal(out.accept_len, ref.accept_len)
    assert torch.equal(out.next_token, ref.next_token)
    assert torch.equal(out.tokens, ref.tokens)
    # the inputs really exercise partial acceptance, not only all-or-nothing
    assert 0 < int(ref.accept_len.sum()) or shape["gamma"] == 1


@pytest.mark.parametrize("cfg", GREEDY_CFGS)
def test_greedy_semantics_and_ties(cfg: dict[str, int]) -> None:
    """Hand-made round: accept while draft == argmax; ties resolve to the first index like torch.argmax."""
    v = 600  # ties straddle a block boundary (512)
    target = torch.zeros(2, 4, v)  # [B, G+1, V]
    target[0, 0, 5] = 1.0
    target[0, 1, 7] = 1.0
    target[0, 2, [3, 520]] = 2.0  # tie: argmax is 3
    target[0, 3, 9] = 1.0
    target[1, :, 530] = 1.0
    draft = torch.tensor([[5, 7, 520], [530, 530, 530]])
    out = verify(draft, target, greedy=True, backend="triton", config=cfg)
    assert out.accept_len.tolist() == [2, 3]
    assert out.next_token.tolist() == [3, 530]  # correction at the tie, bonus for the second request
    assert out.tokens.tolist() == [[5, 7, 3, -1], [530, 530, 530, 530]]
    assert torch.equal(out.tokens, verify_torch(draft, target, greedy=True).tokens)


@pytest.mark.parametrize("greedy", [True, False])
def test_ragged_verify_lengths(greedy: bool) -> None:
    """Per-request verify lengths (the scheduler may cut a request's block short)."""
    shape = {"batch": 6, "gamma": 5, "vocab": 333}
    inp = make_inputs(shape, "cpu", seed=7, greedy=greedy)
    num = torch.tensor([0, 1, 5, 3, 2, 4])
    ref = verify(**inp, num_verify=num, backend="torch")
    for cfg in GREEDY_CFGS[1::3] if greedy else SAMPLE_CFGS[::2]:  # one-launch and split variants
        out = verify(**inp, num_verify=num, backend="triton", config=cfg)
        assert torch.equal(out.accept_len, ref.accept_len)
        assert bool((out.accept_len <= num.to(torch.int32)).all())
        assert torch.equal(out.tokens, ref.tokens)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cfg", SAMPLE_CFGS)
def test_sampling_matches_reference(shape: dict[str, int], cfg: dict[str, int]) -> None:
    inp = make_inputs(shape, "cpu", seed=100 + shape["vocab"], greedy=False)
    ref = verify(**inp, backend="torch")
    out = verify(**inp, backend="triton", config=cfg)
    assert torch.equal(out.accept_len, ref.accept_len)  # same randoms -> the same fp32 decisions
    assert torch.equal(out.next_token, ref.next_token)  # boundary flips are possible but not at these seeds
    assert torch.equal(out.tokens, ref.tokens)


def test_sampling_check_allows_only_cdf_boundary_flips() -> None:
    """The benchmark / tuner check: a resampled token may differ from the reference only at an fp32-ambiguous CDF
    boundary; a token whose interval does not hold the threshold fails."""
    from dspark_core.kernels.verify import ENTRY_SAMPLE, VerifyResult

    inp = make_inputs({"batch": 4, "gamma": 3, "vocab": 50}, "cpu", seed=3, greedy=False)
    ref = verify_torch(**inp)
    a, r = int(ref.accept_len[0]), 0
    w = inp["target"][r, a].double()
    if a < 3 and (res := (w - inp["draft_probs"][r, a].double()).clamp_min(0)).sum() > 0:
        w = res
    cdf = w.cumsum(0)
    k = int((w > 0).nonzero()[5])  # put the threshold exactly on token k's lower boundary: k - 1 and k both fit
    prev = int((w[:k] > 0).nonzero()[-1])
    inp["u_sample"][r] = float(cdf[k - 1] / cdf[-1])
    ref = verify_torch(**inp)
    flipped = ref.next_token.clone()
    flipped[r] = prev if int(ref.next_token[r]) == k else k
    ENTRY_SAMPLE.check(VerifyResult(ref.accept_len, flipped, ref.tokens), ref, inp)
    far = ref.next_token.clone()
    far[r] = int((w > 0).nonzero()[-1]) if int(ref.next_token[r]) < k + 3 else prev
    with pytest.raises(AssertionError, match="outside its CDF interval"):
        ENTRY_SAMPLE.check(VerifyResult(ref.accept_len, far, ref.tokens), ref, inp)


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("split, vocab", [(1, 5), (4, 1100)])
def test_sampling_is_lossless_in_distribution(split: int, vocab: int) -> None:
    """With x ~ q, the first emitted token (accepted draft or residual resample) is distributed as p.

    The split case spreads the 5 live tokens over the three vocabulary slices of 512."""
    n, v = 300 if split == 1 else 160, 5
    gen = torch.Generator().manual_seed(3)
    live = torch.tensor([0, 1, 2, 3, 4]) if vocab == v else torch.tensor([3, 600, 1090, 20, 1099])
    p5 = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    q5 = torch.tensor([0.3, 0.1, 0.3, 0.05, 0.25])
    p = torch.zeros(vocab).index_put_((live,), p5)
    q = torch.zeros(vocab).index_put_((live,), q5)
    flat = torch.zeros(vocab).index_put_((live,), torch.full((v,), 1.0 / v))
    target = torch.stack([p, flat])[None].expand(n, 2, vocab).contiguous()  # [N, 2, V]
    draft_probs = q[None, None].expand(n, 1, vocab).contiguous()  # [N, 1, V]
    draft = live[torch.multinomial(q5, n, replacement=True, generator=gen)][:, None]  # [N, 1]
    u_acc, u_smp = torch.rand(n, 1, generator=gen), torch.rand(n, generator=gen)
    out = verify(draft, target, greedy=False, draft_probs=draft_probs, u_accept=u_acc, u_sample=u_smp,
                 backend="triton", config={**CFG, "SPLIT": split})
    ref = verify_torch(draft, target, greedy=False, draft_probs=draft_probs, u_accept=u_acc, u_sample=u_smp)
    assert torch.equal(out.accept_len, ref.accept_len)
    assert (out.next_token != ref.next_token).sum() <= 1  # a CDF-boundary flip at most
    slot = {int(t): i for i, t in enumerate(live)}
    first = torch.tensor([slot[int(t)] for t in out.tokens[:, 0]])
    assert _chi2(torch.bincount(first, minlength=v).float(), p5) < 18.47  # chi-square, 4 dof, p 0.001
    # acceptance rate is sum_x min(p, q) (the overlap), the known closed form
    overlap = float(torch.minimum(p5, q5).sum())
    assert abs(float((out.accept_len == 1).float().mean()) - overlap) < 0.08
    # every request that accepted its only draft token got a bonus token from the uniform second row
    bonus = torch.tensor([slot[int(t)] for t in out.tokens[out.accept_len == 1, 1]])
    assert _chi2(torch.bincount(bonus, minlength=v).float(), torch.full((v,), 1.0 / v)) < 18.47


def test_residual_without_mass_falls_back_to_p() -> None:
    """If p(x) < q(x) rejects but max(0, p - q) rounds to no mass, both implementations sample from p."""
    p = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])  # [1, 2, 3]
    q = torch.tensor([[[0.0, 0.5, 0.5]]])  # identical: u * q(x) < p(x) fails only for u >= 1 - never, so
    draft = torch.tensor([[1]])  # force a rejection with u = 1 (outside [0, 1) but allowed as a tensor)
    args = {"draft_probs": q, "u_accept": torch.ones(1, 1), "u_sample": torch.tensor([0.75])}
    out = verify(draft, p, greedy=False, backend="triton", config=CFG, **args)
    ref = verify_torch(draft, p, greedy=False, **args)
    assert out.accept_len.tolist() == ref.accept_len.tolist() == [0]
    assert out.next_token.tolist() == ref.next_token.tolist() == [2]  # CDF of p: 0, .5, 1 -> 0.75 -> 2


def test_bad_shapes_are_value_errors() -> None:
    with pytest.raises(ValueError, match="target"):
        verify(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, 10), greedy=True, backend="torch")
    with pytest.raises(ValueError, match="sampling needs"):
        verify(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 4, 10), greedy=False, backend="torch")
