"""A verify step that prefills admitted requests in the same forward (dspark_core/modeling/compiled_mixed.py)
against the eager prefill and verify it replaces: fp32, the tiny target, one graph for every mix."""

from __future__ import annotations

import shutil

import pytest
import torch

from dspark_core.config import ASSETS
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.compiled import MAX_T, CompiledStep

pytestmark = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                                reason="torch.compile on a CPU needs a C++ compiler")

# (verify slots, tokens per row, real tokens, prompt slots, prompt lengths): a ragged verify with two prompts, a
# lone decoding row with one prompt (its sizes padded to 2), three rows with three prompts
CASES = [([2, 0], 3, [3, 1], [1, 3], [6, 4]), ([4], 1, [1], [0], [7]), ([3, 4, 1], 5, [5, 2, 1], [0, 2, 5], [2, 9, 3])]


def test_a_mixed_step_equals_eager_prefill_then_verify_in_one_graph():
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v, layers = model.arch.vocab_size, (0, model.arch.num_hidden_layers - 1)
    compiled = CompiledStep(model)
    for i, (slots, t, n_new, pslots, plens) in enumerate(CASES):
        eager, comp = model.new_cache(6, 64), model.new_cache(6, 64)
        context = torch.randint(0, v, (len(slots), 12))
        for cache in (eager, comp):
            model(context, cache, slots)
            cache.truncate(slots[0], 9)  # rows at different lengths
        tokens, prompts = torch.randint(0, v, (len(slots), t)), torch.randint(0, v, (len(pslots), max(plens)))
        want_fill = model(prompts, eager, pslots, plens, hidden_layers=layers, last_only=True)
        want = model(tokens, eager, slots, n_new, hidden_layers=layers)
        assert compiled.takes_mixed(comp, slots, pslots, plens, layers)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):  # every size dynamic: one graph
            got, fill = compiled.mixed(tokens, comp, slots, n_new, prompts, pslots, plens, layers)
        for r, n in enumerate(n_new):
            assert torch.allclose(got.row_logits(r), want.row_logits(r)[:n], atol=1e-4, rtol=1e-4), (i, r)
            assert torch.equal(got.row_logits(r).argmax(-1), want.row_logits(r)[:n].argmax(-1))
            assert torch.allclose(got.row_hidden(r), want.row_hidden(r)[:n], atol=1e-4, rtol=1e-4)
        assert torch.allclose(fill.logits, want_fill.logits, atol=1e-4, rtol=1e-4) and fill.logits.shape[:2] == (
            len(pslots), 1)
        for r, n in enumerate(plens):
            assert torch.allclose(fill.row_hidden(r), want_fill.row_hidden(r)[:n], atol=1e-4, rtol=1e-4)
        assert comp.lens.tolist() == eager.lens.tolist()
        for layer in range(model.arch.num_hidden_layers):  # every committed position holds the same keys
            for s, n in enumerate(eager.lens.tolist()):
                assert torch.allclose(comp.k[layer][s, :n], eager.k[layer][s, :n], atol=1e-5)
                assert torch.allclose(comp.v[layer][s, :n], eager.v[layer][s, :n], atol=1e-5)
    assert list(compiled.seen) == [("mixed", layers)]


def test_mixing_is_refused_for_a_one_token_prompt_a_live_slot_or_a_full_slot():
    model = load_model(ASSETS / "target", "cpu", "fp32")
    compiled = CompiledStep(model)
    cache = model.new_cache(3, 40, margin=0)
    cache.lens[0] = 10
    assert compiled.takes_mixed(cache, [0], [1, 2], [4, 5])
    assert not compiled.takes_mixed(cache, [0], [1], [1])  # a one-token prompt
    assert not compiled.takes_mixed(cache, [0], [0], [4])  # a slot twice
    cache.lens[2] = 3
    assert not compiled.takes_mixed(cache, [0], [2], [4])  # a slot holding a request
    cache.lens[0] = 40 - MAX_T + 1
    assert not compiled.takes_mixed(cache, [0], [1], [4])  # the longest verify would not fit the slot


def _run(engine, prompts: list[str], lengths: list[int]) -> dict[str, list[int]]:
    """Every prompt through engine.step, each with its own length; the outputs' tokens by prompt."""
    from dspark_core.verification.sampling import SamplingParams

    ids = {engine.add_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)): p
           for p, n in zip(prompts, lengths, strict=True)}
    out = {}
    while engine.has_work():
        for u in engine.step():
            if u.output is not None:
                out[ids[u.request_id]] = u.output.token_ids
    return out


def test_an_engine_prefills_admissions_inside_its_rounds_and_stays_token_identical(tiny_target, tiny_tokenizer):
    """Two slots, five prompts of different lengths: admissions join a running request's verify step (the mixed
    graph, one for every round), and greedy fp32 outputs of suffix decoding equal eager plain decoding's."""
    from conftest import engine_config

    from dspark_core.engine import Engine

    prompts = ["import os\nimport sys\n", "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
               "def f(x):\n    return x", "class Stack:\n    def __init__(self):\n        self.items = []\n",
               "while True:\n"]
    lengths = [12, 20, 7, 16, 9]
    want = _run(Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer), prompts, lengths)
    for mixed in (True, False):  # mixing off: each admission prefills in a forward of its own
        cfg = engine_config(block=4, max_requests=2, method="suffix")
        cfg.compile, cfg.batch.mixed_prefill_tokens = True, 64 if mixed else 0
        eng = Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer)
        try:
            got = _run(eng, prompts, lengths)
        finally:
            tiny_target.compiled = None
        assert got == want, mixed
        assert (eng.stats.admit_rounds >= 2) if mixed else eng.stats.admit_rounds == 0
        assert (0 < eng.stats.mixed_s <= eng.stats.decode_s) if mixed else eng.stats.mixed_s == 0.0
