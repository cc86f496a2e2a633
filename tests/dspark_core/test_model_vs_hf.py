"""The lean runner reproduces transformers' logits (fp32, relative error < 1e-4) for every family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_ref import FAMILIES, make_random_checkpoint

from dspark_core.config import ASSETS
from dspark_core.modeling.checkpoint import load_model, save_model

REL = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def hf_logits(folder: Path, tokens: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = ref(tokens, output_hidden_states=True)
    return out.logits, out.hidden_states


def check_against_hf(folder: Path, vocab: int) -> None:
    """Full forward, and a cached forward with two slots of different lengths appending blocks."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (2, 40), generator=gen)
    ref, ref_hidden = hf_logits(folder, tokens)
    model = load_model(folder, "cpu", "fp32")
    n_layers = model.arch.num_hidden_layers
    full, _ = model.forward_full(tokens)
    assert rel_err(full.detach(), ref) < REL
    cache = model.new_cache(4, 64)
    model(tokens[:1, :25], cache, [3])  # request A: 25 prompt tokens in slot 3
    model(tokens[1:, :31], cache, [1])  # request B: 31 prompt tokens in slot 1
    block = torch.stack([tokens[0, 25:30], tokens[1, 31:36]])
    out = model(block, cache, [3, 1], [5, 3], hidden_layers=(n_layers - 1, 0))  # concatenated in this order
    assert rel_err(out.logits[0], ref[0, 25:30]) < REL
    assert rel_err(out.logits[1, :3], ref[1, 31:34]) < REL
    width = model.arch.hidden_size
    # hidden states are returned before the final norm; HF's last hidden state has the norm applied
    first = out.hidden[0, :, width:] if n_layers > 1 else model.norm(out.hidden[0, :, width:]).detach()
    assert rel_err(first, ref_hidden[1][0, 25:30]) < REL  # layer 0 output = HF states[1]
    last = model.norm(out.hidden[1, :3, :width]).detach()
    assert rel_err(last, ref_hidden[n_layers][1, 31:34]) < REL
    assert cache.length(3) == 30 and cache.length(1) == 34
    cache.truncate(3, 27)  # O(1) rollback, then continue from the rolled-back point
    out = model(tokens[:1, 27:33], cache, [3])
    assert rel_err(out.logits[0], ref[0, 27:33]) < REL


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_checkpoint_matches_transformers(family: str, tmp_path: Path) -> None:
    folder = make_random_checkpoint(family, tmp_path / family)
    check_against_hf(folder, 97)


@pytest.mark.parametrize("which", ["target", "draft"])
def test_tiny_models_match_transformers(which: str) -> None:
    check_against_hf(ASSETS / which, 4096)


def test_save_then_load_roundtrip(tmp_path: Path) -> None:
    from conftest import random_model

    model = random_model(3)
    save_model(model, tmp_path / "m", dtype="fp32")
    again = load_model(tmp_path / "m", "cpu", "fp32")
    toks = torch.randint(0, 48, (1, 12))
    assert torch.equal(model.forward_full(toks)[0], again.forward_full(toks)[0])
