"""RMSNorm (+ fused residual) and SwiGLU kernels vs their torch references."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels.rmsnorm import make_inputs as norm_inputs
from dspark_core.kernels.rmsnorm import rmsnorm
from dspark_core.kernels.swiglu import make_inputs as act_inputs
from dspark_core.kernels.swiglu import swiglu

ONE = {"BLOCK_H": 0, "num_warps": 4, "num_stages": 1}  # whole row in one block
LOOP = {"BLOCK_H": 1024, "num_warps": 4, "num_stages": 1}  # chunked two-pass path


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # fp32: rounding only; bf16: one rounding step (the interpreter rounds toward zero, GPUs to nearest)
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1.6e-2}


@pytest.mark.parametrize("shape", [{"rows": 3, "hidden": 100}, {"rows": 5, "hidden": 2500}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cfg", [ONE, LOOP])
def test_rmsnorm_residual(shape: dict[str, int], dtype: torch.dtype, cfg: dict[str, int]) -> None:
    inp = norm_inputs(shape, "cpu", seed=shape["hidden"], dtype=dtype)
    out, res = rmsnorm(**inp, backend="triton", config=cfg)
    ref_out, ref_res = rmsnorm(**inp, backend="torch")
    assert out.dtype == dtype and res.shape == inp["x"].shape
    torch.testing.assert_close(res.float(), ref_res.float(), **_tol(dtype))
    torch.testing.assert_close(out.float(), ref_out.float(), **_tol(dtype))
    if dtype == torch.float32:  # and the reference is the textbook formula
        h = inp["x"] + inp["residual"]
        expect = inp["weight"] * h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + inp["eps"])
        torch.testing.assert_close(ref_out, expect, rtol=1e-5, atol=1e-5)


def test_rmsnorm_plain_3d() -> None:
    inp = norm_inputs({"rows": 6, "hidden": 72}, "cpu", seed=2, dtype=torch.float32)
    x = inp["x"].reshape(2, 3, 72)
    out, res = rmsnorm(x, inp["weight"], 1e-5, backend="triton", config=LOOP)
    ref, _ = rmsnorm(x, inp["weight"], 1e-5, backend="torch")
    assert res is x and out.shape == (2, 3, 72)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [{"rows": 2, "inter": 300}, {"rows": 3, "inter": 1100}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_packed_views(shape: dict[str, int], dtype: torch.dtype) -> None:
    inp = act_inputs(shape, "cpu", seed=shape["inter"], dtype=dtype)
    assert not inp["gate"].is_contiguous()  # strided halves of one packed projection
    out = swiglu(**inp, backend="triton", config={"BLOCK": 256, "num_warps": 4, "num_stages": 1})
    ref = swiglu(**inp, backend="torch")
    torch.testing.assert_close(out.float(), ref.float(), **_tol(dtype))
    g, u = inp["gate"].float(), inp["up"].float()
    torch.testing.assert_close(ref.float(), (g * torch.sigmoid(g) * u).to(dtype).float(), **_tol(dtype))


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="swiglu"):
        swiglu(torch.zeros(2, 3), torch.zeros(2, 4), backend="torch")
    with pytest.raises(ValueError, match="rmsnorm"):
        rmsnorm(torch.zeros(2, 3), torch.ones(4), 1e-6, backend="torch")
