"""The compiled decode / verify step (dspark_core/modeling/compiled.py) against the eager model it replaces: one
shape bucket, fp32, on the tiny target."""

from __future__ import annotations

import shutil

import pytest
import torch

from dspark_core.config import ASSETS
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.compiled import MAX_T, CompiledStep, bucket

pytestmark = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                                reason="torch.compile on a CPU needs a C++ compiler")


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    assert bucket(3, 128) == 128 and bucket(129, 128) == 256


def test_a_ragged_verify_step_equals_eager_and_pads_nothing_into_other_slots():
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v = model.arch.vocab_size
    prompts = torch.randint(0, v, (4, 20))
    eager, comp = model.new_cache(4, 64), model.new_cache(4, 64)
    for cache in (eager, comp):
        model(prompts, cache, [0, 1, 2, 3])
        cache.truncate(1, 17)  # slots at different lengths
    step = torch.randint(0, v, (3, 3))  # 3 rows (padded to 4), 3 tokens (padded to 4), ragged n_new
    slots, n_new = [2, 0, 1], [3, 1, 2]
    want = model(step, eager, slots, n_new)
    assert CompiledStep.takes(3, comp, slots) and not CompiledStep.takes(MAX_T + 1, comp, slots)
    compiled = CompiledStep(model)
    model.compiled = compiled
    try:
        got = model(step, comp, slots, n_new)
    finally:
        model.compiled = None
    assert list(compiled.seen) == [(4, 4, comp.max_len, ())]  # one bucket: rows, tokens, keys (all 96 < MIN_LK)
    for r, n in enumerate(n_new):
        assert torch.allclose(got.row_logits(r)[:n], want.row_logits(r)[:n], atol=1e-4, rtol=1e-4)
        assert torch.equal(got.row_logits(r)[:n].argmax(-1), want.row_logits(r)[:n].argmax(-1))
    assert comp.lens.tolist() == eager.lens.tolist() == [21, 19, 23, 20]
    for layer in range(model.arch.num_hidden_layers):  # every committed position holds the same keys
        for s, n in enumerate(eager.lens.tolist()):
            assert torch.allclose(comp.k[layer][s, :n], eager.k[layer][s, :n], atol=1e-5)
            assert torch.allclose(comp.v[layer][s, :n], eager.v[layer][s, :n], atol=1e-5)
