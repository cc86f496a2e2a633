"""Fused Markov-head step vs its torch reference (greedy and Gumbel-max sampling)."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels.markov_head import U_MAX, U_MIN, make_inputs, markov_step

CFG = {"BLOCK_V": 64, "BLOCK_B": 16, "BLOCK_R": 32, "num_warps": 4, "num_stages": 2}
# ragged tails everywhere: vocab not a multiple of BLOCK_V, batch not of BLOCK_B, rank not of BLOCK_R
SHAPES = [{"batch": 3, "vocab": 50, "rank": 16}, {"batch": 17, "vocab": 203, "rank": 40}]


def _scores(inp: dict, z: torch.Tensor) -> torch.Tensor:
    if inp["greedy"]:
        return z
    return z - torch.log(-torch.log(inp["uniforms"].clamp(U_MIN, U_MAX)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(shape: dict[str, int], greedy: bool, dtype: torch.dtype) -> None:
    inp = make_inputs(shape, "cpu", seed=shape["vocab"], greedy=greedy, dtype=dtype)
    tok_ref, z_ref = markov_step(**inp, return_logits=True, backend="torch")
    tok, z = markov_step(**inp, return_logits=True, backend="triton", config=CFG)
    torch.testing.assert_close(z, z_ref, rtol=1e-5, atol=1e-4)
    s = _scores(inp, z_ref)
    rows = torch.arange(shape["batch"])
    # the same token, or a tie within rounding of the fp32 sums
    assert bool(((tok == tok_ref) | ((s[rows, tok] - s[rows, tok_ref]).abs() < 1e-4)).all())
    assert bool((tok == tok_ref).float().mean() == 1.0)


def test_without_temperature_and_logits() -> None:
    shape = {"batch": 4, "vocab": 97, "rank": 24}
    inp = make_inputs(shape, "cpu", seed=1, greedy=True)
    inp["temperature"] = None
    tok, z = markov_step(**inp, backend="triton", config=CFG)
    ref, _ = markov_step(**inp, backend="torch")
    assert z is None
    assert torch.equal(tok, ref)
    expected = (inp["base"] + inp["w1"][inp["x_prev"]] @ inp["w2"]).argmax(-1)  # the formula itself
    assert torch.equal(tok, expected)


def test_gumbel_max_samples_softmax() -> None:
    """Token frequencies over many uniforms follow softmax(z) (Gumbel-max sampling is exact)."""
    n, v, r = 400, 6, 16
    gen = torch.Generator().manual_seed(5)
    base = torch.tensor([0.0, 1.0, -1.0, 0.5, 2.0, 0.0])[None].expand(n, v).contiguous()
    w1 = torch.zeros(v, r)
    w2 = torch.zeros(r, v)
    w1[2, 0], w2[0, 0] = 1.0, 1.5  # previous token 2 boosts token 0 by 1.5
    x_prev = torch.full((n,), 2)
    t = torch.full((n,), 0.8)
    u = torch.rand(n, v, generator=gen)
    tok, _ = markov_step(base, x_prev, w1, w2, t, u, greedy=False, backend="triton", config=CFG)
    ref, _ = markov_step(base, x_prev, w1, w2, t, u, greedy=False, backend="torch")
    assert torch.equal(tok, ref)
    p = torch.softmax((base[0] + torch.tensor([1.5, 0, 0, 0, 0, 0])) / 0.8, dim=0)
    counts = torch.bincount(tok, minlength=v).float()
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 20.52  # chi-square, 5 dof, p-value 0.001


def test_bad_shapes() -> None:
    inp = make_inputs({"batch": 2, "vocab": 10, "rank": 4}, "cpu", seed=0, greedy=False)
    inp["uniforms"] = None
    with pytest.raises(ValueError, match="uniforms"):
        markov_step(**inp, backend="torch")
