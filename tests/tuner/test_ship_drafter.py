"""A measured bundle ships the drafter its trials ran, with the files beside it that change what it drafts: its STS
calibration and its reduced draft vocabulary (tuner/export.py `_ship_drafter`)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

from dspark_core.config import ASSETS
from dspark_core.drafters.draft_vocab import VOCAB_FILE, VocabFile, load_vocab, save_vocab
from dspark_core.modeling.checkpoint import load_model
from tuner.export import _ship_drafter


def test_the_shipped_drafter_keeps_its_draft_vocabulary(tmp_path) -> None:
    target = load_model(ASSETS / "target", "cpu", "fp32")
    src = tmp_path / "measured"
    shutil.copytree(ASSETS / "drafters" / "markov", src)
    vocab = VocabFile(vocab_size=target.arch.vocab_size, tokens=[5, 3, 9], counts=[7, 2, 1])
    save_vocab(src, vocab)
    _ship_drafter(src, tmp_path / "bundle", SimpleNamespace(target=target))
    assert load_vocab(tmp_path / "bundle" / VOCAB_FILE, target.arch.vocab_size) == vocab
