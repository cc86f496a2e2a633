"""Suffix decoding's calibration (issue 42): the offline rounds are the engine's rounds, the fitted map beats the raw
ratios on sequences it was not fitted on, the drafter reports calibrated confidences, and a bad file is one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import engine_config

from dspark_core.drafters.suffix import SuffixDrafter, suffix_calibration
from dspark_core.drafters.suffix_calibration import (
    CORPUS,
    FEATURES,
    GLOBAL,
    OWN,
    SuffixCalibration,
    load_calibration,
)
from dspark_core.engine import Engine
from dspark_core.errors import DSparkError
from dspark_core.training.suffix_fit import fit_calibration, suffix_rounds
from dspark_core.verification.sampling import SamplingParams

PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
           "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"]


def test_offline_rounds_are_the_engines_greedy_rounds(tiny_target, tiny_tokenizer) -> None:
    """One request at a time, fp32 greedy: the engine's accepted tokens and drafted rounds equal the offline
    simulation over the same prompts and outputs (global tree included: finished outputs join it in order)."""
    cfg = engine_config(block=6, max_requests=1, method="suffix")
    eng = Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer)
    gen = eng.generate(PROMPTS, SamplingParams(max_new_tokens=40, ignore_eos=True))
    seqs = []
    for prompt, out in zip(PROMPTS, gen.outputs, strict=True):
        ids = tiny_tokenizer.encode(prompt)
        seqs.append((ids + out.token_ids, len(ids)))
    rows = suffix_rounds(seqs, SuffixDrafter(), gamma=6)
    assert gen.stats.accepted > 0
    assert sum(a for _, _, a in rows.rounds) == gen.stats.accepted
    assert len(rows.rounds) == gen.stats.drafts


def _repetitive(seed: int, n: int = 24) -> list[tuple[list[int], int]]:
    """Sequences with copied spans and noise: some suffix matches hold, some do not."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(40) for _ in range(30)]
        seq = list(base)
        while len(seq) < 160:
            if rng.random() < 0.6:
                i = rng.randrange(len(seq) - 8)
                seq += seq[i:i + rng.randrange(3, 9)]
            else:
                seq.append(rng.randrange(40))
        out.append((seq, 30))
    return out


def test_the_fit_beats_the_raw_ratios_on_sequences_it_was_not_fitted_on() -> None:
    cal = fit_calibration(_repetitive(0), SuffixDrafter(min_prob=0.0, spec_factor=8.0), gamma=8,
                          fitted_on={"source": "test"})
    h = cal.heldout
    assert h["rows"] > 200 and h["sequences"] == 12
    assert h["brier_calibrated"] < h["brier_raw"] and h["ece_calibrated"] < h["ece_raw"]
    err_raw = abs(h["accepted_per_round_raw"] - h["accepted_per_round_measured"])
    err_cal = abs(h["accepted_per_round_calibrated"] - h["accepted_per_round_measured"])
    assert err_cal < err_raw
    assert cal.features == list(FEATURES) and len(cal.weights) == len(FEATURES)


def test_the_drafter_reports_calibrated_confidences(tmp_path: Path) -> None:
    cal = SuffixCalibration(features=list(FEATURES), weights=[0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0])  # P falls with
    # position
    d = SuffixDrafter(calibration=cal)
    seq = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    d.reset(0, seq, None)
    from dspark_core.drafters.base import DraftRequest

    p = d.propose([DraftRequest(slot=0, tokens=seq, gamma=3, sampling=SamplingParams(), prompt_len=len(seq))])
    assert p.tokens[0, :3].tolist() == [3, 4, 5]
    assert p.confidence[0, :3].tolist() == pytest.approx([cal.prob(1.0, 2, 2, k) for k in range(3)], rel=1e-5)
    assert p.confidence[0, 0] > p.confidence[0, 2]


def test_auto_finds_the_committed_file_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    cfg = engine_config(method="suffix")
    cfg.model.path = str(tmp_path)  # no committed assets: auto is the raw ratios
    assert suffix_calibration(cfg) is None
    bad = tmp_path / "cal.json"
    old = {"features": ["bias", "logit_ratio", "log_support", "log_match", "position"], "weights": [0] * 5}
    for text, want in (("{", "not a suffix calibration"), (json.dumps(old), "not this version's"),
                       (json.dumps({"features": list(FEATURES), "weights": [0]}), "1 weights for 8")):
        bad.write_text(text)
        with pytest.raises(DSparkError, match=want) as e:
            load_calibration(bad)
        assert "\n" not in str(e.value)
    cfg.drafter.suffix_calibration = str(tmp_path / "missing.json")
    with pytest.raises(DSparkError, match="cannot read"):
        suffix_calibration(cfg)
    cfg.drafter.suffix_calibration = "none"
    assert suffix_calibration(cfg) is None


def test_a_whole_drafts_probs_are_each_tokens_prob_to_the_bit() -> None:
    """`probs` (every draft of every tree, every round) takes the match's term once; the sums stay `prob`'s."""
    cal = SuffixCalibration(features=list(FEATURES), weights=[-1.3, 0.25, 0.37, 1.2, -0.11, -0.9, -0.6, -0.2])
    rng = random.Random(0)
    for _ in range(500):
        n, match, source = rng.randrange(1, 9), rng.randrange(1, 24), rng.choice([OWN, GLOBAL, CORPUS])
        ratios = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)]
        supports = [rng.randrange(1, 5000) for _ in range(n)]
        assert cal.probs(ratios, supports, match, source) == [
            cal.prob(r, s, match, k, source) for k, (r, s) in enumerate(zip(ratios, supports, strict=True))]


def test_every_trees_draft_is_scored_and_the_fit_learns_each_tree() -> None:
    """With a corpus, a round's rows hold the corpus's draft as well as the one the round drafted with, and the
    fitted model prices a corpus draft apart from the request's own (here the corpus holds noise that shares
    tokens with the requests: its drafts are reached but rarely accepted)."""
    from dspark_core.drafters.suffix_corpus import CorpusIndex

    rng = random.Random(5)
    noise = [[rng.randrange(40) for _ in range(200)] for _ in range(20)]
    seqs = _repetitive(0)
    d = SuffixDrafter(min_prob=0.0, spec_factor=8.0, corpus=CorpusIndex(noise, 24))
    rows = suffix_rounds(seqs, d, gamma=8)
    src = [(x[FEATURES.index("global")], x[FEATURES.index("corpus")]) for x in rows.x]
    n_corpus = sum(1 for _, c in src if c == 1.0)
    assert n_corpus > 100 and sum(1 for g, c in src if g == c == 0.0) > 100
    acc = {k: sum(y for (g, c), y in zip(src, rows.y, strict=True) if c == k) / max(1, sum(1 for _, c in src if c == k))
           for k in (0.0, 1.0)}
    assert acc[1.0] < acc[0.0]
    cal = fit_calibration(seqs, d, gamma=8, fitted_on={"source": "test"})
    assert cal.prob(0.5, 20, 3, 0, CORPUS) < cal.prob(0.5, 20, 3, 0, OWN)
    by = cal.heldout["by_tree"]  # on the sequences it was not fitted on, each tree's drafts priced apart
    assert by["corpus"]["rows"] > 0 and by["own"]["rows"] > 0
    assert abs(by["corpus"]["predicted_calibrated"] - by["corpus"]["accept_rate"]) \
        < abs(by["corpus"]["predicted_without_trees"] - by["corpus"]["accept_rate"])
    assert cal.heldout["brier_calibrated"] <= cal.heldout["brier_without_trees"]


def test_the_calibrations_chat_prompts_leave_out_the_corpuss(tmp_path: Path) -> None:
    """calibrate-suffix scores corpus drafts on prompts the corpus did not continue, and refuses a corpus that does
    not say which prompts it continued."""
    from dspark_core.cli.commands_suffix import _corpus
    from dspark_core.drafters.suffix_corpus import CorpusFile, save_corpus
    from dspark_core.training.chat_prompts import chat_prompts

    enc = lambda s: [ord(c) % 97 for c in s]  # noqa: E731 - a stand-in tokenizer
    used = {tuple(p) for p in chat_prompts(enc, 300, max_len=10_000, seed=7, heldout=False)}
    rest = chat_prompts(enc, 300, max_len=10_000, seed=1000, heldout=False, exclude=used)
    assert not used & {tuple(p) for p in rest}
    path = tmp_path / "corpus.json"
    save_corpus(path, CorpusFile(target="t", dtype="fp32", prompts="chat", max_new_tokens=8, chat_count=4,
                                 sequences=[[1, 2, 3]]))
    with pytest.raises(DSparkError, match="does not record which prompts") as e:
        _corpus(str(path), tmp_path, 100, 24)
    assert "\n" not in str(e.value)
    save_corpus(path, CorpusFile(target="t", dtype="fp32", prompts="code", max_new_tokens=8, code_count=4,
                                 code_source="stdlib", sequences=[[1, 2, 3]]))
    with pytest.raises(DSparkError, match="calibration's own source"):
        _corpus(str(path), tmp_path, 100, 24)
    index, exclude, note = _corpus("none", tmp_path, 100, 24)
    assert index is None and not exclude and note == "none"
