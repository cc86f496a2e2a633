"""The AR draft of a pretrained target: cut from the target, distilled on cached p_t, committed without the
shared embedding and assembled back into a full Hugging Face folder that loads (ours and transformers')."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import random_model

from dspark_core.errors import DSparkError
from dspark_core.modeling.checkpoint import load_model, save_model
from dspark_core.training.train import TrainData, cache_target
from dspark_core.training.train_ar import EMBED, ARSpec, assemble, cut_target, distill, save_slim


@pytest.fixture()
def target(tmp_path):
    model = random_model(3, vocab=48, layers=3)
    model.arch.tie_word_embeddings = True
    model.lm_head.weight = model.embed.weight
    folder = save_model(model, tmp_path / "target", dtype="fp32")
    return load_model(folder, "cpu", "fp32"), folder


def _data(target) -> TrainData:
    """Cached target outputs, with p_t replaced by a rule the cut model does not know: next = token + 1 mod 48."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 48, (6, 24), generator=gen)
    data = cache_target(target, TrainData(tokens=tokens, prompt_len=8), (0,), k=2)
    data.top_ids = torch.stack([(tokens + 1) % 48, (tokens + 2) % 48], dim=-1).int()
    data.top_probs = torch.tensor([0.9, 0.1]).expand(6, 24, 2).half()
    return data


def test_cut_keeps_the_first_layers_and_the_strongest_channels(target) -> None:
    model, _ = target
    student = cut_target(model, ARSpec(layers=1, intermediate=32))
    assert student.arch.num_hidden_layers == 1 and student.arch.intermediate_size == 32
    assert torch.equal(student.embed.weight, model.embed.weight) and not student.embed.weight.requires_grad
    assert torch.equal(student.layers[0].qkv.weight, model.layers[0].qkv.weight)
    with pytest.raises(DSparkError, match="layers"):
        cut_target(model, ARSpec(layers=3, intermediate=32))


def test_distillation_lowers_the_loss_and_resumes(target, tmp_path) -> None:
    model, _ = target
    data = _data(model)
    losses: list[float] = []
    spec = ARSpec(layers=1, intermediate=32, steps=30, batch_seqs=4, positions=8, lr=1e-2, checkpoint_every=10)
    distill(cut_target(model, spec), data, spec, tmp_path / "state", on_step=lambda s, loss: losses.append(loss))
    assert len(losses) == 30 and sum(losses[-5:]) < sum(losses[:5])
    again: list[int] = []  # a rerun with the finished checkpoint does no further steps
    distill(cut_target(model, spec), data, spec, tmp_path / "state", on_step=lambda s, loss: again.append(s))
    assert again == []


def test_slim_draft_assembles_into_a_loadable_folder(target, tmp_path) -> None:
    model, folder = target
    spec = ARSpec(layers=1, intermediate=32)
    student = cut_target(model, spec)
    slim = save_slim(student, tmp_path / "slim", spec)
    from safetensors import safe_open

    with safe_open(str(slim / "model.safetensors"), "pt") as f:
        assert EMBED not in f.keys()
    full = assemble(slim, folder, tmp_path / "full")
    assert json.loads((full / ".dspark-ar-draft").read_text())["sha256"]
    loaded = load_model(full, "cpu", "fp32")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        for p in student.parameters():  # the committed draft is bf16
            p.copy_(p.bfloat16().float())
        torch.testing.assert_close(loaded.forward_full(ids)[0], student.forward_full(ids)[0], rtol=1e-5, atol=1e-5)
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(full), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, loaded.forward_full(ids)[0], rtol=1e-4, atol=1e-4)


def test_assemble_never_replaces_a_foreign_folder(target, tmp_path) -> None:
    model, folder = target
    spec = ARSpec(layers=1, intermediate=32)
    slim = save_slim(cut_target(model, spec), tmp_path / "slim", spec)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(DSparkError, match="not written by dspark-tune"):
        assemble(slim, folder, mine)
    assert (mine / "notes.txt").read_text() == "keep"
