"""The DSpark drafter's reduced draft vocabulary (drafters/draft_vocab.py): the ranking file, the round's columns,
and that drafting over them keeps speculative decoding lossless (greedy identity, the sampled marginal)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import engine_config, random_drafter, random_model, sampled_second_token_tv

from dspark_core.drafters.draft_vocab import (
    FORMAT,
    VOCAB_FILE,
    DraftVocab,
    VocabFile,
    build_vocab,
    load_vocab,
    rank_tokens,
    save_vocab,
)
from dspark_core.errors import DSparkError
from dspark_core.verification.sampling import SamplingParams


def _with_vocab(drafter, ids: list[int]):  # noqa: ANN001, ANN202 - DSparkDrafter
    m = drafter.model
    drafter.vocab = DraftVocab(ids, m.lm_head.weight.detach(), m.head.w2.weight.detach())
    return drafter


def test_the_ranking_counts_what_the_target_wrote_most_first() -> None:
    rows = torch.tensor([[9, 9, 9, 1, 2, 2], [9, 9, 9, 3, 2, 1]])  # 3 prompt tokens a row, never counted
    ids, counts = rank_tokens(rows, 3, 10)
    assert ids == [2, 1, 3] and counts == [3, 2, 1]  # ties by id


def test_the_file_is_checked_and_only_ours_is_replaced(tmp_path) -> None:
    v = VocabFile(vocab_size=10, tokens=[2, 1, 3], counts=[3, 2, 1])
    save_vocab(tmp_path, v)
    assert load_vocab(tmp_path / VOCAB_FILE, 10).tokens == [2, 1, 3]
    save_vocab(tmp_path, v)  # ours: replaced
    with pytest.raises(DSparkError, match="the target has 12"):
        load_vocab(tmp_path / VOCAB_FILE, 12)
    bad = {"format": FORMAT, "vocab_size": 10, "tokens": [1, 1], "counts": [2, 2]}
    (tmp_path / VOCAB_FILE).write_text(json.dumps(bad))
    with pytest.raises(DSparkError, match="distinct") as e:
        load_vocab(tmp_path / VOCAB_FILE, 10)
    assert "\n" not in str(e.value)
    (tmp_path / VOCAB_FILE).write_text("{not json")
    with pytest.raises(DSparkError, match="not JSON"):
        load_vocab(tmp_path / VOCAB_FILE, 10)
    with pytest.raises(DSparkError, match="not written by dspark-tune"):  # a user's file of that name stays
        save_vocab(tmp_path, v)
    assert (tmp_path / VOCAB_FILE).read_text() == "{not json"
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    save_vocab(elsewhere, v)  # ours, but reached through a link: the link is not replaced, nor what it points at
    link_dir = tmp_path / "linked"
    link_dir.mkdir()
    (link_dir / VOCAB_FILE).symlink_to(elsewhere / VOCAB_FILE)
    with pytest.raises(DSparkError, match="not written by dspark-tune"):
        save_vocab(link_dir, v)


def test_unset_means_the_whole_vocabulary_without_a_ranking(tmp_path) -> None:
    w = torch.randn(10, 4)
    read = []

    def weights():  # noqa: ANN202
        read.append(1)
        return w, None

    assert build_vocab(tmp_path, None, 10, weights) is None
    with pytest.raises(DSparkError, match="draft-vocab"):
        build_vocab(tmp_path, 4, 10, weights)
    save_vocab(tmp_path, VocabFile(vocab_size=10, tokens=[5, 6, 7], counts=[3, 2, 1]))
    assert build_vocab(tmp_path, 0, 10, weights) is None
    assert not read  # the weights are read only for a reduced vocabulary
    assert build_vocab(tmp_path, 2, 10, weights).static.tolist() == [5, 6]


def test_a_rounds_columns_add_the_contexts_tokens_outside_the_ranking() -> None:
    v = DraftVocab([0, 1, 2], torch.randn(20, 4), torch.randn(20, 3))
    c = v.columns([(0, [1, 7, 2, 9])])
    assert c.ids.tolist() == [0, 1, 2, 7, 9]
    assert torch.equal(c.logits(torch.eye(4)), torch.eye(4) @ v.full_lm[c.ids].T)
    assert v.columns([(0, [1, 7, 2, 9, 11]), (1, [5])]).ids.tolist() == [0, 1, 2, 5, 7, 9, 11]
    v.forget(0)
    assert v.columns([(0, [3])]).ids.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_greedy_over_a_reduced_vocabulary_is_token_identical_to_plain(head: str) -> None:
    from dspark_core.engine import Engine

    target = random_model(11, vocab=48)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 40, 41, 7, 8]]
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = Engine(engine_config(method="plain"), target=target).generate(prompts, sp)
    drafter = _with_vocab(random_drafter(target, head=head), list(range(0, 48, 3)))
    gen = Engine(engine_config(method="dspark"), target=target, drafter=drafter).generate(prompts, sp)
    assert [o.token_ids for o in gen.outputs] == [o.token_ids for o in plain.outputs]
    assert gen.stats.verified > 0


def test_drafts_come_only_from_the_columns() -> None:
    from dspark_core.drafters.base import DraftRequest

    target = random_model(11, vocab=48)
    drafter = _with_vocab(random_drafter(target), [0, 3, 6])
    prompt = [10, 11, 12, 10, 11]
    with torch.no_grad():
        _, hidden = target.forward_full(torch.tensor([prompt]), hidden_layers=drafter.hidden_layers)
    drafter.reset(0, prompt[:-1], hidden[0, :-1])
    for sp in (SamplingParams(), SamplingParams(temperature=1.0)):
        gen = torch.Generator().manual_seed(0)
        p = drafter.propose([DraftRequest(slot=0, tokens=prompt, gamma=4, sampling=sp, generator=gen)])
        assert set(p.tokens[0].tolist()) <= {0, 3, 6, 10, 11, 12}
        if p.probs is not None:  # the proposal's mass is on the columns only
            assert float(p.probs[0][:, [0, 3, 6, 10, 11, 12]].sum()) == pytest.approx(4.0, abs=1e-5)


def test_sampled_output_over_a_reduced_vocabulary_follows_the_target() -> None:
    """The marginal of the 2nd sampled token equals the target's exact one when the drafter's proposal covers only
    part of the vocabulary (two ranked tokens plus the prompt's)."""
    target = random_model(5, vocab=6)
    drafter = _with_vocab(random_drafter(target, block=3), [4, 5])
    tv, gen = sampled_second_token_tv(target, drafter, "dspark", [1, 2, 1, 2], 1500)
    assert tv < 0.05
    assert gen.stats.verified > 0 and gen.stats.accepted < gen.stats.verified
