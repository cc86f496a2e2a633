"""Greedy identity against plain decoding: share of identical outputs and the first divergence with its margin."""

from __future__ import annotations

import pytest
from conftest import random_model

from dspark_core.cli.identity import first_difference, identity


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


def test_identity_reports_the_first_divergence_with_the_target_margin() -> None:
    model = random_model(0)
    prompts = [[1, 2, 3], [4, 5]]
    plain = [[7, 8, 9], [10, 11]]
    share, div = identity(model, prompts, plain, [[7, 8, 9], [10, 11]])
    assert share == 1.0 and div is None
    share, div = identity(model, prompts, plain, [[7, 8, 9], [10, 12]])
    assert share == pytest.approx(0.5)
    assert (div.prompt, div.position, div.plain_token, div.method_token) == (1, 1, 11, 12)
    assert div.top2_margin >= 0.0
