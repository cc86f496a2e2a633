"""The DSpark drafter's compiled backbone (drafters/dspark_compiled.py) against the eager one it replaces, and its
all-greedy drafting loop against the general one: fp32, small random models, the rows' slots out of order, a
reduced vocabulary, sampled rows, and the engine token-identical to plain."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import engine_config, random_drafter, random_model

from dspark_core.drafters.base import DraftRequest
from dspark_core.drafters.draft_vocab import DraftVocab
from dspark_core.verification.sampling import SamplingParams

pytestmark = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                                reason="torch.compile on a CPU needs a C++ compiler")


@pytest.fixture
def compiled_calls(monkeypatch) -> list[int]:  # noqa: ANN001
    """Rows B of every round that ran the compiled backbone."""
    from dspark_core.drafters import dspark_compiled

    calls: list[int] = []
    real = dspark_compiled.states

    def counted(model, anchors, *a, **k):  # noqa: ANN001, ANN202
        calls.append(anchors.shape[0])
        return real(model, anchors, *a, **k)

    monkeypatch.setattr(dspark_compiled, "states", counted)
    return calls


def _primed(target, drafter, prompts: dict[int, list[int]]):  # noqa: ANN001, ANN202
    """Reset `drafter`'s slots with the target's states of each prompt but its last token."""
    for slot, prompt in prompts.items():
        with torch.no_grad():
            _, hidden = target.forward_full(torch.tensor([prompt]), hidden_layers=drafter.hidden_layers)
        drafter.reset(slot, prompt[:-1], hidden[0, :-1])
    return drafter


@pytest.mark.parametrize("vocab", [False, True])
def test_a_compiled_round_equals_eager(vocab: bool, compiled_calls: list[int]) -> None:
    target = random_model(11, vocab=48)
    drafter = random_drafter(target, block=4)
    if vocab:
        m = drafter.model
        drafter.vocab = DraftVocab(list(range(0, 48, 3)), m.lm_head.weight.detach(), m.head.w2.weight.detach())
    prompts = {2: [5, 6, 7, 8, 9, 5, 6], 0: [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 30], 1: [40, 41, 42]}
    _primed(target, drafter, prompts)
    reqs = [DraftRequest(slot=s, tokens=p, gamma=4, sampling=SamplingParams()) for s, p in prompts.items()]
    want = drafter.propose(reqs)
    drafter.compiled = True
    got = drafter.propose(reqs)
    assert torch.equal(got.tokens, want.tokens) and got.num == want.num
    assert torch.allclose(got.confidence, want.confidence, atol=1e-5)
    lone = drafter.propose(reqs[1:2])  # one row: dynamo's own graph for a size-1 batch
    drafter.compiled = False
    assert torch.equal(lone.tokens, drafter.propose(reqs[1:2]).tokens)
    assert compiled_calls == [3, 1]


def test_sampled_rows_short_blocks_and_entropies_draft_the_same_through_the_compiled_backbone(
        compiled_calls: list[int]) -> None:
    target = random_model(11, vocab=48)
    drafter = _primed(target, random_drafter(target, block=4), {0: [1, 2, 3, 4, 5], 1: [9, 8, 7, 9, 8]})

    def rounds() -> list:  # noqa: ANN202 - Proposals
        drafter.want_entropy = False
        sampled = [DraftRequest(slot=s, tokens=t, gamma=4, sampling=SamplingParams(temperature=1.0),
                                generator=torch.Generator().manual_seed(s)) for s, t in ((0, [1, 2, 3, 4, 5]),
                                                                                      (1, [9, 8, 7, 9, 8]))]
        short = [DraftRequest(slot=0, tokens=[1, 2, 3, 4, 5], gamma=2, sampling=SamplingParams())]
        out = [drafter.propose(sampled), drafter.propose(short)]
        drafter.want_entropy = True  # the learned scheduler's feature: the general loop
        return [*out, drafter.propose(short)]

    want = rounds()
    drafter.compiled = True
    got = rounds()
    assert compiled_calls == [2, 1, 1]
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g.tokens, w.tokens) and torch.allclose(g.confidence, w.confidence, atol=1e-5)
    assert torch.allclose(got[0].probs, want[0].probs, atol=1e-5)
    assert torch.allclose(got[2].entropy, want[2].entropy, atol=1e-5)


@pytest.mark.parametrize("head", ["markov", "none"])
def test_the_greedy_loop_equals_the_general_one(head: str) -> None:
    """`draft`'s all-greedy loop (one W2 matrix over the columns) against its general loop (entropies asked)."""
    target = random_model(11, vocab=48)
    drafter = random_drafter(target, head=head, block=4)
    m = drafter.model
    w2 = m.head.w2.weight.detach() if m.head.w2 is not None else None
    drafter.vocab = DraftVocab(list(range(0, 48, 5)), m.lm_head.weight.detach(), w2)
    prompts = {0: [1, 2, 3, 4, 1, 2, 3, 4, 1], 1: [40, 41, 42, 7, 7]}  # context tokens outside the ranking
    _primed(target, drafter, prompts)
    reqs = [DraftRequest(slot=s, tokens=p, gamma=4, sampling=SamplingParams()) for s, p in prompts.items()]
    fast = drafter.propose(reqs)
    drafter.want_entropy = True
    general = drafter.propose(reqs)
    assert torch.equal(fast.tokens, general.tokens)
    assert torch.allclose(fast.confidence, general.confidence, atol=1e-6)


def test_an_engine_drafting_compiled_is_token_identical_to_plain(compiled_calls: list[int]) -> None:
    from dspark_core.engine import Engine

    target = random_model(11, vocab=48)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 40, 41, 7, 8], [20, 21, 22]]
    sp = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = Engine(engine_config(method="plain"), target=target).generate(prompts, sp)
    drafter = random_drafter(target, block=4)
    drafter.compiled = True
    gen = Engine(engine_config(method="dspark"), target=target, drafter=drafter).generate(prompts, sp)
    assert [o.token_ids for o in gen.outputs] == [o.token_ids for o in plain.outputs]
    assert gen.stats.verified > 0 and 3 in compiled_calls


def test_warm_compiles_what_the_rounds_then_run() -> None:
    """After `warm`, rounds of other row counts and contexts compile nothing more."""
    from dspark_core.drafters.base import RoundResult

    torch._dynamo.reset()
    target = random_model(11, vocab=48)
    drafter = random_drafter(target, block=4)
    drafter.compiled = True
    assert drafter.warm(4).startswith("drafter rounds of 1 and 2+ rows in ")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    prompts = {1: [5, 6, 7, 8, 9, 5, 6], 2: [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 30], 0: [40, 41, 42]}
    _primed(target, drafter, prompts)
    drafter.propose([DraftRequest(slot=s, tokens=p, gamma=4, sampling=SamplingParams()) for s, p in prompts.items()])
    width = 2 * target.arch.hidden_size
    drafter.update([RoundResult(slot=s, proposed=4, verified=4, accepted=2, new_tokens=[1, 2, 3],
                                hidden=torch.randn(3, width)) for s in prompts])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
