"""The tiny-model builder's pieces: stdlib-only sources, tokenizer, a few training steps, HF-format output."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from rich.progress import Progress

from dspark_core.drafters.ngram import lookup
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.checkpoint import load_model, save_model
from dspark_core.training.build_tiny import (
    TrainSpec,
    distill_lm,
    encode_corpus,
    heldout_loss,
    is_heldout,
    stdlib_sources,
    train_lm,
    train_tokenizer,
)


def test_sources_are_the_standard_library_only() -> None:
    files = stdlib_sources()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert len(files) > 500
    assert all(stdlib in f.parents and "site-packages" not in f.parts for f in files)
    held = sum(is_heldout(f) for f in files)
    assert 0 < held < len(files) * 0.1


def test_tokenizer_train_and_save_roundtrip(tmp_path: Path) -> None:
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in stdlib_sources()[:20]]
    tok_file = train_tokenizer(texts, tmp_path / "tokenizer.json")
    data = encode_corpus(tok_file, texts)
    assert data.numel() > 1000 and int(data.max()) < 4096
    arch = ArchConfig(model_type="qwen3", vocab_size=4096, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      tie_word_embeddings=True, qk_norm=True, eos_token_id=0)
    with Progress(disable=True) as progress:
        spec = TrainSpec(steps=4, batch=2, seq=32, warmup=2)
        model = train_lm(arch, data, spec, 0, progress, "t")
        again = train_lm(arch, data, spec, 0, progress, "t")
        student = distill_lm(train_lm(arch, data, spec, 1, progress, "s"), model, data, spec, 2, progress, "kd")
    x = data[:16][None]
    assert torch.equal(model.forward_full(x)[0], again.forward_full(x)[0])  # deterministic with the seed
    assert 0 < heldout_loss(student, data, seq=32, max_windows=4) < 20
    save_model(model, tmp_path / "m", dtype="fp32", tokenizer_file=tok_file)
    assert {p.name for p in (tmp_path / "m").iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    loaded = load_model(tmp_path / "m", "cpu", "fp32")
    assert torch.allclose(loaded.forward_full(x)[0], model.forward_full(x)[0])


def test_ngram_lookup_copies_the_latest_continuation() -> None:
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert lookup(toks, 2, 4, 1) == [7, 8]  # suffix [1, 2, 3] last seen before 7, 8
    assert lookup(toks, 5, 4, 1) == [7, 8, 1, 2, 3]
    assert lookup([5, 6], 3, 4, 1) == []
    assert lookup([4, 4, 4], 3, 2, 1) == [4]
