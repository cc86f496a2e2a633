"""top1 (dspark_core/modeling/argmax.py) returns exactly what argmax returns: ties, NaN, dtypes, shapes."""

import pytest
import torch

from dspark_core.modeling.argmax import top1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(49152,), (1, 8192), (7, 1000), (2, 3, 33)])
def test_top1_is_argmax_with_ties_and_nan(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, shape, generator=g).to(dtype)  # five values: every row ties many times
    assert torch.equal(top1(x), x.argmax(-1))
    x.view(-1, shape[-1])[0, shape[-1] // 2] = float("nan")  # a NaN wins its row in both
    assert torch.equal(top1(x), x.argmax(-1))


def test_top1_keeps_the_first_index_of_a_tie() -> None:
    x = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    assert top1(x).tolist() == [1, 0]
