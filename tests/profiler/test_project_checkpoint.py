"""The profiler reads the project's own checkpoint format (dspark_core.modeling.checkpoint: what build-tiny writes)."""

from __future__ import annotations

import json
import math

import pytest

import cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import torch

    from dspark_core.modeling.arch import ArchConfig
    from dspark_core.modeling.checkpoint import save_model
    from dspark_core.modeling.model import LeanModel
    from dspark_core.training.build_tiny import stdlib_sources, train_tokenizer

    d = tmp_path_factory.mktemp("tiny")
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_sources()[:20]]
    tok_file = train_tokenizer(texts, d / "tok" / "tokenizer.json")
    vocab = json.loads(tok_file.read_text())["model"]["vocab"]
    torch.manual_seed(0)
    arch = ArchConfig(model_type="qwen3", vocab_size=len(vocab) + 1, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      tie_word_embeddings=True, qk_norm=True, eos_token_id=0)
    model = LeanModel(arch)
    out = save_model(model, d / "ckpt", dtype="fp32", tokenizer_file=tok_file)
    return out, sum(p.numel() for p in model.parameters()), len(vocab) + 1


def test_profile_counts_the_checkpoint_exactly(capsys, ckpt):
    folder, numel, _ = ckpt
    assert cli.main(["profile", "--model", str(folder), "--no-store", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["params_total"] == numel and out["model"]["family"] == "qwen3"


def test_entropy_runs_on_the_checkpoint(monkeypatch, ckpt):
    import profiler.build as build

    folder, _, vocab = ckpt
    monkeypatch.setattr(build, "runnable_model", lambda: folder)
    p = build.build_profile(str(folder), None, "code", entropy=True)
    assert p.workload.entropy is not None
    assert 0 < p.workload.entropy.mean <= math.log(vocab) + 1e-6


def test_profile_tiny_reference_target_with_entropy(capsys):
    """`--model tiny` is the committed reference target (dspark_core/assets/tiny/target)."""
    from safetensors import safe_open

    from profiler.workload import TINY_TARGET

    assert cli.main(["profile", "--model", "tiny", "--workload", "code", "--entropy", "--no-store", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with safe_open(str(TINY_TARGET / "model.safetensors"), "pt") as f:
        numel = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert out["model"]["params_total"] == numel
    vocab = out["model"]["vocab_size"]
    ent = out["workload"]["entropy"]
    assert 0 < ent["mean"] <= ent["p90"] <= math.log(vocab) + 1e-6
