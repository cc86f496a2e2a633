"""Suffix decoding: the tree's counts, the proposal rule (longest match, most frequent continuation, probability
floor, length by match), the global tree of finished outputs, and losslessness in the engine (greedy token
identity; sampled outputs follow the target)."""

from __future__ import annotations

import random

import pytest
from conftest import engine_config, random_model, sampled_second_token_tv

from dspark_core.drafters.base import DraftRequest, RoundResult
from dspark_core.drafters.suffix import SuffixDrafter
from dspark_core.drafters.suffix_tree import Node, SuffixTree
from dspark_core.engine import Engine
from dspark_core.verification.sampling import SamplingParams


def _dump(node: Node, pre: tuple[int, ...] = ()) -> dict[tuple[int, ...], tuple[int, int]]:
    out: dict[tuple[int, ...], tuple[int, int]] = {}
    for tok, kid in (node.kids or {}).items():
        out[pre + (tok,)] = (kid.count, kid.cont)
        out.update(_dump(kid, pre + (tok,)))
    return out


def _substrings(seq: list[int], depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for i in range(len(seq)):
        for j in range(i + 1, min(i + depth, len(seq)) + 1):
            counts[tuple(seq[i:j])] = counts.get(tuple(seq[i:j]), 0) + 1
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_counts_every_substring_up_to_its_depth_and_removal_undoes_insertion(seed: int) -> None:
    rng = random.Random(seed)
    seq = [rng.randrange(5) for _ in range(60)]
    grown, bulk = SuffixTree(6), SuffixTree(6)
    for i in range(0, len(seq), 7):  # appended in pieces, as tokens are committed
        grown.append(seq[i : i + 7])
    bulk.insert(seq)
    assert {k: v[0] for k, v in _dump(grown.root).items()} == _substrings(seq, 6)
    assert _dump(grown.root) == _dump(bulk.root) and grown.nodes == bulk.nodes
    other = [rng.randrange(5) for _ in range(30)]
    bulk.insert(other)
    bulk.remove(other)
    assert _dump(bulk.root) == _dump(grown.root) and bulk.nodes == grown.nodes
    bulk.remove(seq)
    assert bulk.root.kids == {} and bulk.nodes == 1


def test_match_skips_a_suffix_seen_only_at_the_end() -> None:
    t = SuffixTree(8)
    t.append([7, 1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 3])
    node, k = t.match([0, 8, 1, 2, 3], 7)  # "8 1 2 3" occurred only at the end (no continuation yet)
    assert k == 3 and node.cont == 3  # "1 2 3": followed by 4, 4, 5


def test_proposal_rule() -> None:
    t = SuffixTree(8)
    t.append([1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3])  # "1 2 3" -> 4 twice, 5 once
    node, k = t.match([1, 2, 3], 7)
    assert k == 3
    toks, probs, supports = SuffixTree.follow(node, 4, 0.1)
    assert toks == [4, 9, 1, 2] and probs[0] == pytest.approx(2 / 3)
    assert supports == [3, 2, 2, 2]  # "1 2 3" continued 3 times, then "1 2 3 4" twice, ...
    assert SuffixTree.follow(node, 4, 0.7)[0] == []  # 2/3 is below the floor
    assert SuffixTree.follow(node, 1, 0.1)[0] == [4]  # the limit
    assert t.match([6, 6], 7) is None  # nothing seen


def _request(slot: int, tokens: list[int], gamma: int, prompt_len: int) -> DraftRequest:
    return DraftRequest(slot=slot, tokens=tokens, gamma=gamma, sampling=SamplingParams(), prompt_len=prompt_len)


def test_draft_length_follows_the_match_and_finished_outputs_feed_the_global_tree() -> None:
    d = SuffixDrafter(depth=24, spec_factor=1.0, min_prob=0.1, cache_tokens=64)
    out = [5, 6, 7, 8, 9, 10, 11, 12]
    d.reset(0, [1, 2], None)
    d.update([RoundResult(slot=0, proposed=0, verified=0, accepted=0, new_tokens=out, finished=True)])
    d.release(0)  # its output is in the global tree now
    d.reset(1, [3, 5, 6], None)
    p = d.propose([_request(1, [3, 5, 6], 8, 3)])
    assert p.num == [2] and p.tokens[0, :2].tolist() == [7, 8]  # match "5 6" (2 tokens): 2 drafted, from global
    assert d.stats.from_global == 1 and p.confidence is not None
    p = d.propose([_request(1, [3, 5, 6, 7, 8, 9], 8, 3)])
    assert p.tokens[0, : p.num[0]].tolist() == [10, 11, 12]  # a longer match drafts further (the output ends)
    for _ in range(10):  # the cache keeps at most 64 finished tokens: the oldest leave first
        d.reset(2, [0], None)
        d.update([RoundResult(slot=2, proposed=0, verified=0, accepted=0, new_tokens=list(range(20, 40)))])
        d.release(2)
    assert sum(map(len, d._cached)) <= 64 and d.glob.match([5, 6], 23) is None
    d.forget()  # a bench pass replaying the same prompts starts with no global tree
    assert d.glob.nodes == 1 and not d._cached


PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n", "x",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"]


@pytest.mark.parametrize("block", [1, 4, 8, 16])
def test_suffix_greedy_is_token_identical_to_plain(block: int, tiny_target, tiny_tokenizer) -> None:
    sp = SamplingParams(max_new_tokens=24, ignore_eos=False)
    plain = Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer).generate(PROMPTS, sp)
    cfg = engine_config(block=block, max_requests=2, method="suffix")
    drafter = SuffixDrafter()
    eng = Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer, drafter=drafter)
    for _ in range(2):  # the second pass also drafts from the first pass's outputs (global tree)
        gen = eng.generate(PROMPTS, sp)
        assert [o.token_ids for o in gen.outputs] == [o.token_ids for o in plain.outputs]
    assert drafter.stats.from_global > 0 and gen.stats.verified > 0


def test_suffix_sampled_output_follows_the_target() -> None:
    """The marginal of the 2nd sampled token equals the target's exact one, with suffix drafts (from the prompt's
    repeats and from earlier outputs) rejected and accepted along the way."""
    tv, gen = sampled_second_token_tv(random_model(5, vocab=6), SuffixDrafter(min_prob=0.0), "suffix",
                                      [1, 2, 3, 1, 2, 3, 1, 2], 1500)
    assert tv < 0.05
    assert gen.stats.verified > 0 and gen.stats.accepted < gen.stats.verified  # real rejections happened


def test_a_requests_tree_indexes_a_sliding_window() -> None:
    """Past `window` tokens the oldest starts leave the tree: it holds what a tree of the last `window` tokens holds,
    so its memory is bounded whatever the request's length."""
    rng = random.Random(3)
    d = SuffixDrafter(depth=6, window=64)
    prompt = [rng.randrange(7) for _ in range(50)]
    d.reset(0, prompt, None)
    toks = list(prompt)
    for _ in range(40):
        new = [rng.randrange(7) for _ in range(rng.randrange(1, 9))]
        d.update([RoundResult(slot=0, proposed=0, verified=0, accepted=0, new_tokens=new)])
        toks += new
    ref = SuffixTree(6)
    ref.insert(toks[-64:])
    tree = d._slots[0].tree
    assert _dump(tree.root) == _dump(ref.root) and tree.nodes == ref.nodes
    with pytest.raises(ValueError, match="within 6 tokens of the end"):
        tree.drop_start(toks, len(toks) - 3)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_match_last_is_match_of_the_appended_sequence_through_window_drops(seed: int) -> None:
    rng = random.Random(seed)
    depth, window = 6, 9
    tree, seq, dropped = SuffixTree(depth), [], 0
    for _ in range(40):  # committed in pieces, the window's old starts dropped as the drafter does
        piece = [rng.randrange(3) for _ in range(rng.randrange(1, 5))]
        tree.append(piece)
        seq.extend(piece)
        for start in range(dropped, len(seq) - window):
            tree.drop_start(seq, start)
        dropped = max(dropped, len(seq) - window)
        for longest in range(1, depth + 1):
            assert tree.match_last(longest) == tree.match(seq, longest)
