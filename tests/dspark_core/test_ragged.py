"""Ragged verification: a batch whose rows append different numbers of tokens computes only the real tokens
(packed), gives each row exactly what it gets alone, and keeps greedy generation at concurrency 8
token-identical to plain decoding; the engine's schedulers price such batches by their real tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import engine_config, random_model

from dspark_core.engine import Engine
from dspark_core.modeling.model import LeanModel
from dspark_core.verification.sampling import SamplingParams
from dspark_core.verification.sps import SpsTable
from dspark_core.verification.verify_scheduler import (
    affine_sps,
    build_verify_scheduler,
    profile_target_sps,
    ragged_rows,
)

REL = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _histories(model: LeanModel, lens: list[int], slots: list[int], seed: int) -> tuple:
    """Two caches holding the same random histories: one filled by a ragged batched prefill, one row by row."""
    gen = torch.Generator().manual_seed(seed)
    v = model.arch.vocab_size
    prompts = [torch.randint(1, v, (n,), generator=gen) for n in lens]
    batched, alone = model.new_cache(max(slots) + 1, 96), model.new_cache(max(slots) + 1, 96)
    grid = torch.zeros(len(lens), max(lens), dtype=torch.long)
    for r, p in enumerate(prompts):
        grid[r, : len(p)] = p
    out = model(grid, batched, slots, lens, hidden_layers=(1, 0), last_only=True)
    for r, (p, s) in enumerate(zip(prompts, slots, strict=True)):
        ref = model(p[None], alone, [s], hidden_layers=(1, 0), last_only=True)
        assert rel_err(out.row_logits(r), ref.flat_logits[0]) < REL
        assert rel_err(out.row_hidden(r), ref.flat_hidden[0]) < REL
        assert rel_err(out.logits[r], ref.logits[0]) < REL
        assert batched.length(s) == alone.length(s) == len(p)
    return batched, alone


@pytest.mark.parametrize("slots", [[0, 1, 2, 3], [3, 0, 5, 1]])  # consecutive (a view of the cache) or not
def test_ragged_batch_equals_each_row_alone(slots: list[int]) -> None:
    model = random_model(3, vocab=64, layers=3)
    batched, alone = _histories(model, [7, 12, 1, 20], slots, seed=1)
    gen = torch.Generator().manual_seed(2)
    for n_new in ([3, 9, 1, 6], [9, 9, 9, 2], [1, 1, 1, 5]):  # ragged verify rounds, rolled back in between
        block = torch.randint(1, 64, (4, max(n_new)), generator=gen)
        out = model(block, batched, slots, n_new, hidden_layers=(2,))
        assert out.pack is not None and out.flat_logits.shape[0] == sum(n_new)  # only real tokens computed
        best = out.argmax()
        for r, (n, s) in enumerate(zip(n_new, slots, strict=True)):
            base = alone.length(s)
            ref = model(block[r : r + 1, :n], alone, [s], hidden_layers=(2,))
            assert rel_err(out.row_logits(r), ref.flat_logits[0]) < REL
            assert rel_err(out.logits[r, :n], ref.flat_logits[0]) < REL
            assert rel_err(out.hidden[r, :n], ref.flat_hidden[0]) < REL
            assert torch.equal(best[r, :n], ref.flat_logits[0].argmax(-1))
            assert batched.length(s) == alone.length(s) == base + n
            batched.truncate(s, base + n // 2)  # reject a suffix, like a verify round does
            alone.truncate(s, base + n // 2)


def test_full_rows_keep_the_dense_layout() -> None:
    model = random_model(4)
    cache = model.new_cache(2, 32)
    out = model(torch.randint(1, 48, (2, 5)), cache, [0, 1], [5, 5], hidden_layers=(0,))
    assert out.pack is None and out.flat_logits.shape == (2, 5, 48) and out.hidden.shape[:2] == (2, 5)


PROMPTS = [
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    if i % 2 == 0:\n",
    "    return self._",
    "def parse(text):\n    tokens = []\n    for line in text.splitlines():\n",
    "import json\n\nwith open(path) as f:\n    data = ",
    "    if not isinstance(value, str):\n        raise TypeError(",
    "from collections import defaultdict\n\ncounts = defaultdict(int)\nfor word in words:\n",
    "try:\n    import numpy as np\nexcept ImportError:\n",
    "    def __repr__(self):\n        return f\"",
]
SP = SamplingParams(max_new_tokens=20)


@pytest.fixture(scope="module")
def plain8(tiny_target, tiny_tokenizer) -> list[list[int]]:
    eng = Engine(engine_config(method="plain", max_requests=8), target=tiny_target, tokenizer=tiny_tokenizer)
    return [o.token_ids for o in eng.generate(PROMPTS, SP).outputs]


@pytest.mark.parametrize("scheduler", ["verify_all", "prefix"])
def test_concurrency_8_greedy_is_token_identical_to_plain(scheduler: str, plain8, tiny_target,
                                                           tiny_tokenizer) -> None:
    cfg = engine_config(block=8, max_requests=8, method="dspark")
    cfg.spec.head = "markov"
    cfg.spec.scheduler = scheduler  # type: ignore[assignment]
    # a steep SPS table makes the prefix scheduler trim rows unevenly: the ragged path is exercised
    sps = SpsTable.from_probes([(b, 1.0 / (1.0 + 0.08 * b)) for b in range(1, 73)], 72)
    spy = _RaggedSpy(tiny_target)
    sched = build_verify_scheduler(cfg, tiny_target, sps=sps)
    sched.learn_overhead = False  # decisions from the table alone: deterministic
    eng = Engine(cfg, target=spy, tokenizer=tiny_tokenizer, scheduler=sched)  # type: ignore[arg-type]
    gen = eng.generate(PROMPTS, SP)
    assert [o.token_ids for o in gen.outputs] == plain8
    assert gen.stats.tau > 1.0
    assert spy.ragged_prefills > 0  # prompts of different lengths: packed prefill
    if scheduler == "prefix":
        assert spy.ragged_rounds > 0  # rows trimmed to different verify lengths: packed verification


class _RaggedSpy:
    """Delegates to the target and counts the forwards that ran packed (rows of different lengths)."""

    def __init__(self, model: LeanModel) -> None:
        self._model, self.ragged_rounds, self.ragged_prefills = model, 0, 0

    def __getattr__(self, name: str):  # noqa: ANN204 - plain delegation
        return getattr(self._model, name)

    def __call__(self, tokens, cache, slots, n_new=None, **kw):  # noqa: ANN001, ANN204
        out = self._model(tokens, cache, slots, n_new, **kw)
        if out.pack is not None:
            if kw.get("last_only"):
                self.ragged_prefills += 1
            else:
                self.ragged_rounds += 1
        return out


def test_engine_schedulers_price_ragged_batches(tiny_target) -> None:
    cfg = engine_config(block=8, max_requests=4, method="dspark")
    cfg.spec.scheduler = "prefix"  # type: ignore[assignment]
    sched = build_verify_scheduler(cfg, tiny_target, sps=SpsTable.flat(36))
    import torch

    from dspark_core.drafters.base import DraftRequest, Proposal
    from dspark_core.verification.sampling import SamplingParams

    conf = torch.tensor([[0.9, 0.9, 0.9], [0.9, 0.0, 0.0]])
    reqs = [DraftRequest(slot=i, tokens=[1, 2], gamma=3, sampling=SamplingParams()) for i in range(2)]
    lengths = sched.choose(reqs, Proposal(tokens=torch.zeros(2, 3, dtype=torch.long), num=[3, 1], confidence=conf))
    assert sched._batch == sum(lengths) + 2  # ragged: each row pays its own verify length + 1, no padding
    assert ragged_rows(10, 4) == [3, 3, 2, 2] and ragged_rows(2, 4) == [1, 1, 1, 1]


def test_affine_sps_fit_is_exact_on_a_line_and_monotone() -> None:
    times = [(b, 0.004 + 0.0001 * b) for b in (8, 16, 40, 72)]
    t = affine_sps(times, 72)
    assert t.sample_batch_tokens == tuple(range(1, 73)) and t.max_batch_tokens == 72
    assert abs(1.0 / t.lookup(30) - (0.004 + 0.003)) < 1e-9
    noisy = [(8, 0.005), (16, 0.004), (24, 0.003)]  # a falling line: clamped flat, never cheaper when bigger
    flat = affine_sps(noisy, 24)
    assert len(set(flat.sample_steps_per_sec)) == 1


def test_profiled_ragged_table_spans_the_round_batches() -> None:
    model = random_model(6)
    t = profile_target_sps(model, 20, rows=4, context=8, repeats=1, affine=True)
    assert t.max_batch_tokens == 20 and t.sample_batch_tokens[-1] == 20
    assert all(b >= a for a, b in zip(t.sample_steps_per_sec[1:], t.sample_steps_per_sec, strict=False))
    raw = profile_target_sps(model, 20, rows=4, context=8, repeats=1)
    assert raw.sample_batch_tokens == tuple(range(4, 21))


class _DenseTarget:
    """The padded engine of before: every verify row computed to the longest (rows past n_new are garbage the
    engine never reads, and it rolls the cache back to what it accepted)."""

    def __init__(self, model: LeanModel) -> None:
        self._model = model

    def __getattr__(self, name: str):  # noqa: ANN204 - plain delegation
        return getattr(self._model, name)

    def __call__(self, tokens, cache, slots, n_new=None, **kw):  # noqa: ANN001, ANN204
        if kw.get("last_only"):
            return self._model(tokens, cache, slots, n_new, **kw)
        out = self._model(tokens, cache, slots, None, **kw)
        assert out.pack is None
        return out


def test_sampled_generation_matches_the_padded_engine(tiny_target, tiny_tokenizer) -> None:
    """Rejection sampling reads each row's packed logits: same seeds, same tokens as the padded layout."""
    cfg = engine_config(block=8, max_requests=4, method="dspark")
    cfg.spec.head = "markov"
    cfg.spec.scheduler = "prefix"  # type: ignore[assignment]
    sps = SpsTable.from_probes([(b, 1.0 / (1.0 + 0.08 * b)) for b in range(1, 37)], 36)
    sp = SamplingParams(max_new_tokens=16, temperature=0.8, top_k=50, seed=7, ignore_eos=True)
    outs = []
    for target in (tiny_target, _DenseTarget(tiny_target)):
        sched = build_verify_scheduler(cfg, tiny_target, sps=sps)
        sched.learn_overhead = False  # no wall-clock input: both runs choose the same verify lengths
        eng = Engine(cfg, target=target, tokenizer=tiny_tokenizer, scheduler=sched)  # type: ignore[arg-type]
        outs.append([o.token_ids for o in eng.generate(PROMPTS[:6], sp).outputs])
    assert outs[0] == outs[1] and all(len(t) == 16 for t in outs[0])
