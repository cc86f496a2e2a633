"""Suffix decoding's frozen corpus: the suffix array answers as a tree of the same sequences would (match and
follow, on both of follow's paths), the engine stays greedy-identical drafting from it, and its file and command
refuse what they should."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import engine_config

from cli import main
from dspark_core.config import ASSETS
from dspark_core.drafters import suffix_corpus
from dspark_core.drafters.suffix import SuffixDrafter
from dspark_core.drafters.suffix import suffix_corpus as config_corpus
from dspark_core.drafters.suffix_corpus import CorpusFile, CorpusIndex, load_corpus, save_corpus
from dspark_core.drafters.suffix_tree import SuffixTree
from dspark_core.engine import Engine
from dspark_core.errors import DSparkError
from dspark_core.verification.sampling import SamplingParams


@pytest.mark.parametrize("small", [0, 1000])  # follow counting with numpy throughout / in Python throughout
def test_the_index_matches_and_follows_as_a_tree_of_the_same_sequences(small: int, monkeypatch) -> None:
    monkeypatch.setattr(suffix_corpus, "SMALL", small)
    rng = random.Random(small)
    checked = 0
    for _ in range(60):
        vocab, depth = rng.choice([3, 5, 20]), rng.choice([2, 4, 8, 24])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 60))] for _ in range(rng.randrange(1, 8))]
        tree, index = SuffixTree(depth), CorpusIndex(seqs, depth)
        for s in seqs:
            tree.insert(s)
        assert index.tokens == sum(map(len, seqs))
        for _ in range(20):
            ctx = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
            longest = rng.randrange(1, depth + 1)
            a, b = tree.match(ctx, longest), index.match(ctx, longest)
            assert (a is None) == (b is None)
            if a is None or b is None:
                continue
            assert a[1] == b[1] and a[0].cont == len(b[0].ends) - sum(index.fwd[b[0].ends + 1] == -1)
            limit, floor = rng.randrange(1, max(2, depth - a[1] + 1)), rng.choice([0.0, 0.05, 0.3])
            assert tree.follow(a[0], limit, floor) == index.follow(b[0], limit, floor)
            checked += 1
    assert checked > 300


def test_a_match_never_crosses_from_one_sequence_into_the_next() -> None:
    index = CorpusIndex([[1, 2], [3, 4]], 8)
    assert index.match([2, 3], 4)[1] == 1  # "2 3" never occurred: only "3" (continued by 4) matches
    ends = index.match([1, 2], 4)
    assert ends is None  # "2" ends its sequence: nothing ever continued it


PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"]


def test_drafting_from_the_corpus_stays_greedy_identical(tiny_target, tiny_tokenizer) -> None:
    sp = SamplingParams(max_new_tokens=24, ignore_eos=False)
    plain = Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer).generate(PROMPTS, sp)
    outs = [o.token_ids for o in plain.outputs]
    drafter = SuffixDrafter(cache_tokens=0, corpus=CorpusIndex(outs[:2], 24))  # no global tree: the corpus alone
    eng = Engine(engine_config(block=8, max_requests=2, method="suffix"), target=tiny_target,
                 tokenizer=tiny_tokenizer, drafter=drafter)
    gen = eng.generate(PROMPTS, sp)
    assert [o.token_ids for o in gen.outputs] == outs
    assert drafter.stats.from_corpus > 0 and gen.stats.accepted > 0


def test_the_file_round_trips_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    good = CorpusFile(target="t", dtype="bf16", prompts="p", max_new_tokens=8, sequences=[[1, 2, 3], [2, 3, 4]])
    path = save_corpus(tmp_path / "c.json", good)
    assert load_corpus(path, 24, vocab=10).tokens == 6
    with pytest.raises(DSparkError, match="outside the target's vocabulary"):
        load_corpus(path, 24, vocab=4)
    (tmp_path / "bad.json").write_text(json.dumps({"target": "t", "sequences": "x"}))
    with pytest.raises(DSparkError, match="not a suffix corpus"):
        load_corpus(tmp_path / "bad.json", 24, vocab=10)
    with pytest.raises(DSparkError, match="cannot read|no such|not exist"):
        load_corpus(tmp_path / "missing.json", 24, vocab=10)


def test_config_auto_none_and_a_path(tmp_path: Path) -> None:
    cfg = engine_config(method="suffix")
    cfg.model.path = str(ASSETS / "target")  # no committed corpus beside the tiny target
    assert config_corpus(cfg, 10) is None
    path = save_corpus(tmp_path / "c.json", CorpusFile(target="t", dtype="fp32", prompts="p", max_new_tokens=8,
                                                       sequences=[[1, 2, 3]]))
    cfg.drafter.suffix_corpus = str(path)
    assert config_corpus(cfg, 10).tokens == 3
    cfg.drafter.suffix_corpus = "none"
    assert config_corpus(cfg, 10) is None


def test_build_command_writes_a_corpus_and_leaves_a_foreign_file_alone(tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "notes.json"
    foreign.write_text("my notes")
    common = ["build-suffix-corpus", "--target", str(ASSETS / "target"), "--chat-sequences", "2",
              "--max-new-tokens", "8", "--prompt-len", "4096", "--dtype", "fp32", "--no-compile", "--json"]
    assert main([*common, "--out", str(foreign)]) == 2
    assert foreign.read_text() == "my notes" and "is not a suffix corpus" in capsys.readouterr().err
    out = tmp_path / "corpus.json"
    assert main([*common, "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    corpus = CorpusFile.model_validate_json(out.read_bytes())
    assert report["sequences"] == len(corpus.sequences) == 2 and "training split" in corpus.prompts
    assert corpus.chat_count == 2 and corpus.chat_seed is not None and corpus.chat_max_len  # calibrate-suffix reads
    assert main([*common, "--out", str(out)]) == 0  # its own file: rebuilt in place
    for too_much, why in ((["--chat-sequences", "65536", "--max-new-tokens", "4096"], "over the"),
                          (["--code-sequences", "1", "--code-source", "web"], "not one of")):
        assert main([*common, *too_much, "--out", str(tmp_path / "x.json")]) == 2  # before any model is loaded
        assert why in capsys.readouterr().err and not (tmp_path / "x.json").exists()
