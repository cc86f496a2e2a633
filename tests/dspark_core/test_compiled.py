"""The compiled decode / verify step (dspark_core/modeling/compiled.py) against the eager model it replaces: one
shape bucket, fp32, on the tiny target."""

from __future__ import annotations

import shutil

import pytest
import torch

from dspark_core.config import ASSETS
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.compiled import MAX_T, ROWS, TOKENS, CompiledStep, bucket

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
    step = torch.randint(0, v, (3, 3))  # 3 rows, 3 tokens (padded to 4: no engine size given), ragged n_new
    slots, n_new = [2, 0, 1], [3, 1, 2]
    want = model(step, eager, slots, n_new)
    compiled = CompiledStep(model)
    assert compiled.takes(3, comp, slots) and not compiled.takes(MAX_T + 1, comp, slots)
    model.compiled = compiled
    try:
        got = model(step, comp, slots, n_new)
    finally:
        model.compiled = None
    assert list(compiled.seen) == [(ROWS, TOKENS, (), False)]  # one graph: rows, tokens and keys are dynamic
    for r, n in enumerate(n_new):
        assert torch.allclose(got.row_logits(r)[:n], want.row_logits(r)[:n], atol=1e-4, rtol=1e-4)
        assert torch.equal(got.row_logits(r)[:n].argmax(-1), want.row_logits(r)[:n].argmax(-1))
    assert comp.lens.tolist() == eager.lens.tolist() == [21, 19, 23, 20]
    for layer in range(model.arch.num_hidden_layers):  # every committed position holds the same keys
        for s, n in enumerate(eager.lens.tolist()):
            assert torch.allclose(comp.k[layer][s, :n], eager.k[layer][s, :n], atol=1e-5)
            assert torch.allclose(comp.v[layer][s, :n], eager.v[layer][s, :n], atol=1e-5)


def test_every_verify_pads_to_the_engines_verify_length_and_no_further():
    model = load_model(ASSETS / "target", "cpu", "fp32")
    step = CompiledStep(model, sizes=(1, 9))
    assert [step.t_bucket(t) for t in (1, 2, 5, 9, 10)] == [1, 9, 9, 9, 16]


def test_a_16_token_block_verifies_compiled_and_nothing_pads_past_it():
    """spec.block_size goes to 16: its 17-token verify is compiled (it ran eager, at 0.6x block 8's speed, when
    the limit was 16); a 17-token step the engine has no size for would pad to 32 and runs eager."""
    model = load_model(ASSETS / "target", "cpu", "fp32")
    cache = model.new_cache(1, 64)
    model(torch.randint(0, model.arch.vocab_size, (1, 5)), cache, [0])
    assert CompiledStep(model, sizes=(1, 17)).takes(17, cache, [0])
    assert not CompiledStep(model, sizes=(1, 9)).takes(17, cache, [0])


def test_a_spent_compile_budget_runs_new_shapes_eager():
    model = load_model(ASSETS / "target", "cpu", "fp32")
    cache = model.new_cache(2, 64)
    model(torch.randint(0, model.arch.vocab_size, (2, 5)), cache, [0, 1])
    step = CompiledStep(model, budget_s=0.0)
    assert not step.takes(1, cache, [0]) and step.refused == 1 and not step.seen


def test_packed_weights_in_consecutive_slots_equal_eager_nn_linear():
    """The oneDNN-packed linears (modeling/cpu_linear.py) under the compiled step, rows in consecutive slots (read
    as a view, no gather), at an exact verify size: the same logits and keys as the eager nn.Linear model."""
    from dspark_core.modeling.cpu_linear import PackedLinear, pack_linears, supported

    if not supported(torch.float32):
        pytest.skip("oneDNN does not pack fp32 weights on this CPU")
    torch.manual_seed(0)
    ref = load_model(ASSETS / "target", "cpu", "fp32")
    model = load_model(ASSETS / "target", "cpu", "fp32")
    plain_qkv = model.layers[0].qkv.weight.clone()
    assert pack_linears(model) == 4 * model.arch.num_hidden_layers + 1
    assert isinstance(model.lm_head, PackedLinear) and torch.equal(model.layers[0].qkv.weight, plain_qkv)
    v = model.arch.vocab_size
    prompts = torch.randint(0, v, (2, 12))
    eager, comp = ref.new_cache(3, 64), model.new_cache(3, 64)
    prefill = ref(prompts, eager, [1, 2]).logits
    assert torch.allclose(model(prompts, comp, [1, 2]).logits, prefill, atol=1e-4)  # eager packed == nn.Linear
    step = torch.randint(0, v, (2, 3))
    want = ref(step, eager, [1, 2])
    compiled = CompiledStep(model, sizes=(1, 3))
    model.compiled = compiled
    try:
        got = model(step, comp, [1, 2])
    finally:
        model.compiled = None
    assert list(compiled.seen) == [(ROWS, TOKENS, (), True)]  # slots 1-2 read as a view
    assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
    for layer in range(model.arch.num_hidden_layers):
        assert torch.allclose(comp.k[layer][1:3, :15], eager.k[layer][1:3, :15], atol=1e-5)
        assert not comp.k[layer][0].any()  # slot 0 untouched


def test_warm_compiles_each_graph_once_and_longer_contexts_reuse_it():
    model = load_model(ASSETS / "target", "cpu", "fp32")
    cache = model.new_cache(2, 64)
    compiled = CompiledStep(model)
    line = compiled.warm(cache, 2)
    assert line.startswith("compiled 6 step graphs (rows x tokens; B, T: any count past one: 1x1, Bx1, Bx1 gathered, "
                           "prefill 1 row, prefill 2 rows, verify + prefill)")
    assert compiled.warm(cache, 2).startswith("compiled 0 step graphs (rows x tokens; B, T: any count past one: "
                                              "none new)")
    assert cache.lens.tolist() == [0, 0]
    model(torch.randint(0, model.arch.vocab_size, (1, 30)), cache, [0])  # a long prompt (eager prefill)
    model.compiled = compiled
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):  # the key span is dynamic: no new graph
            model(torch.randint(0, model.arch.vocab_size, (1, 1)), cache, [0])
    finally:
        model.compiled = None
    assert cache.lens.tolist() == [31, 0] and len(compiled.seen) == 6


def test_warm_compiles_the_sizes_and_batches_an_engine_meets_on_a_shared_step():
    """Engines sharing a target (bench, a tuner's trials) share one step with the union of their sizes: a plain
    engine's warm compiles its 1-token graphs, not the verify ones only the speculative engines run. Three slots:
    a full batch of three rows runs too (once a graph of its own, padded to four rows, that a fidelity run compiled
    mid-run); it is the rows graph, and then no step of any row count compiles again."""
    model = load_model(ASSETS / "target", "cpu", "fp32")
    cache = model.new_cache(3, 64)
    compiled = CompiledStep(model, sizes=(1, 3, 9))
    line = compiled.warm(cache, 3, sizes=(1,))
    assert line.startswith("compiled 6 step graphs (rows x tokens; B, T: any count past one: 1x1, Bx1, Bx1 gathered, "
                           "prefill 1 row, prefill 3 rows, verify + prefill)")
    assert sorted({k[1] for k in compiled.seen if k[0] not in ("prefill", "mixed")}) == [1]
    model(torch.randint(0, model.arch.vocab_size, (3, 5)), cache, [0, 1, 2])  # three requests decoding
    model.compiled = compiled
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            model(torch.randint(0, model.arch.vocab_size, (3, 1)), cache, [0, 1, 2])
    finally:
        model.compiled = None


def test_warm_compiles_the_graph_that_returns_the_drafters_hidden_states():
    """A drafter's engine asks every step for hidden states: warm compiles that graph, so the first timed step of
    a DSpark method does not compile (bench once charged ~145 s of compiling to one method's window)."""
    model = load_model(ASSETS / "target", "cpu", "fp32")
    cache = model.new_cache(1, 64)
    compiled = CompiledStep(model)
    assert compiled.warm(cache, 1, (0,)).startswith("compiled 2 step graphs (rows x tokens; B, T: any count past one: "
                                                   "1x1, prefill 1 row, with the hidden states of layers [0])")
    model(torch.randint(0, model.arch.vocab_size, (1, 5)), cache, [0])
    model.compiled = compiled
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            out = model(torch.randint(0, model.arch.vocab_size, (1, 1)), cache, [0], hidden_layers=(0,))
    finally:
        model.compiled = None
    assert out.flat_hidden is not None and len(compiled.seen) == 2


def test_engines_sharing_a_target_share_one_compiled_step_with_all_their_sizes():
    from dspark_core.modeling.compiled import attach

    model = load_model(ASSETS / "target", "cpu", "fp32")
    first = attach(model, (1,), 10.0)
    assert attach(model, (1, 9), 99.0) is first and model.compiled is first and first.sizes == (1, 9)


@pytest.fixture
def stand_in_capture(monkeypatch):
    """The GPU path's plumbing on a CPU: a 'graph' whose replay re-runs the captured closure."""
    from dspark_core.modeling import compiled as comp_mod

    def fake_capture(run, pool):  # warm once (as the real one does), replay = the same closure
        run()
        return run

    monkeypatch.setattr(comp_mod, "cuda_capture", fake_capture)


def test_graph_replay_refreshes_static_inputs_and_pads_the_key_span(stand_in_capture):
    """Decode steps across the 256-key boundary and a verify step, in consecutive and scattered slots, equal eager;
    one graph per (shape, first slot, padded span), reused while the span bucket lasts."""
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v = model.arch.vocab_size
    eager, graph = model.new_cache(4, 600), model.new_cache(4, 600)
    prompts = torch.randint(0, v, (4, 250))
    for cache in (eager, graph):
        model(prompts, cache, [0, 1, 2, 3])
    step = CompiledStep(model, sizes=(1, 4), use_graphs=True)
    for i in range(8):  # positions 250..257: the padded span goes 256 -> 512
        slots = [0, 1] if i % 2 == 0 else [3, 1]
        tok = torch.randint(0, v, (2, 1))
        want = model(tok, eager, slots)
        model.compiled = step
        try:
            got = model(tok, graph, slots)
        finally:
            model.compiled = None
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=1e-4), i
    tok = torch.randint(0, v, (2, 4))
    want = model(tok, eager, [0, 1], [4, 2])
    model.compiled = step
    try:
        got = model(tok, graph, [0, 1], [4, 2])
    finally:
        model.compiled = None
    for r, n in enumerate([4, 2]):
        assert torch.allclose(got.row_logits(r)[:n], want.row_logits(r)[:n], atol=1e-4, rtol=1e-4)
    assert graph.lens.tolist() == eager.lens.tolist()
    spans = sorted({k[2] for k in step.graphs})
    assert spans == [256, 512] and not step.graph_error
    assert len(step.graphs) == 5  # (2x1 from slot 0, 2x1 gathered) x 2 spans + the 2x4 verify


def test_a_compiled_prefill_equals_eager_and_runs_only_on_fresh_slots():
    """Prompts packed through the prefill graph (modeling/compiled_prefill.py): the last tokens' logits, every prompt
    position's hidden states and K/V equal eager's in fp32, for ragged rows and for one row; a slot with context or
    a one-token prompt runs eager."""
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v, layers = model.arch.vocab_size, (0, model.arch.num_hidden_layers - 1)
    compiled = CompiledStep(model)
    for slots, n_new in (([2, 0, 1], [6, 2, 5]), ([1], [7])):
        prompts = torch.randint(0, v, (len(slots), max(n_new)))
        eager, comp = model.new_cache(3, 64), model.new_cache(3, 64)
        want = model(prompts, eager, slots, n_new, hidden_layers=layers, last_only=True)
        assert compiled.takes_prefill(prompts, comp, slots, n_new, layers)
        model.compiled = compiled
        try:
            got = model(prompts, comp, slots, n_new, hidden_layers=layers, last_only=True)
        finally:
            model.compiled = None
        assert got.logits.shape == want.logits.shape == (len(slots), 1, v)
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        for r, n in enumerate(n_new):
            assert torch.allclose(got.row_hidden(r), want.row_hidden(r)[:n], atol=1e-4, rtol=1e-4)
        assert comp.lens.tolist() == eager.lens.tolist()
        for layer in range(model.arch.num_hidden_layers):
            for s, n in zip(slots, n_new, strict=True):
                assert torch.allclose(comp.k[layer][s, :n], eager.k[layer][s, :n], atol=1e-5)
                assert torch.allclose(comp.v[layer][s, :n], eager.v[layer][s, :n], atol=1e-5)
    assert set(compiled.seen) == {("prefill", 2, layers), ("prefill", 1, layers)}
    assert not compiled.takes_prefill(torch.zeros(1, 3, dtype=torch.long), comp, [1], [3])  # slot 1 holds a prompt
    assert not compiled.takes_prefill(torch.zeros(1, 1, dtype=torch.long), comp, [2], [1])  # one token


def test_engines_with_other_slot_counts_reuse_the_graphs_that_read_the_whole_cache():
    """Engines sharing a step (bench's methods, a tuner's trials) each bring a cache of their own slot count: a
    gathered step compiled on a 4-slot cache serves a 3-slot one without compiling again, and equals eager there."""
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v = model.arch.vocab_size
    compiled = CompiledStep(model)
    for n_slots in (4, 3):
        eager, comp = model.new_cache(n_slots, 64), model.new_cache(n_slots, 64)
        prompts = torch.randint(0, v, (n_slots, 6))
        for cache in (eager, comp):
            model(prompts, cache, list(range(n_slots)))
        tok = torch.randint(0, v, (2, 1))
        want = model(tok, eager, [2, 0])  # two rows out of order: a gather over the whole cache
        model.compiled = compiled
        try:
            with torch._dynamo.config.patch(error_on_recompile=n_slots == 3):
                got = model(tok, comp, [2, 0])
        finally:
            model.compiled = None
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=1e-4), n_slots
    assert len(compiled.seen) == 1


def test_graph_replay_on_a_new_cache_captures_again(stand_in_capture):
    """A CUDA graph bakes in the addresses of the cache it was captured on: an engine sharing the step with another
    (bench, a tuner's trials) must not replay the other engine's graphs."""
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "fp32")
    v = model.arch.vocab_size
    step = CompiledStep(model, use_graphs=True)
    for _ in range(2):  # two engines, one after the other, each with its own cache
        eager, graph = model.new_cache(2, 300), model.new_cache(2, 300)  # a span of 256 keys: not the whole cache
        prompts = torch.randint(0, v, (2, 5))
        for cache in (eager, graph):
            model(prompts, cache, [0, 1])
        tok = torch.randint(0, v, (2, 1))
        want = model(tok, eager, [0, 1])
        model.compiled = step
        try:
            got = model(tok, graph, [0, 1])
        finally:
            model.compiled = None
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        assert graph.lens.tolist() == eager.lens.tolist() == [6, 6] and not step.graph_error
        assert len(step.graphs) == 1
