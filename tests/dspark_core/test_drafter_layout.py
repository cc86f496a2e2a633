"""Drafters in the layout SGLang 0.5.23 and vLLM 0.33 load: the fields and tensor names those releases read
(docs/drafters.md cites file and line), and a round trip through it that changes no output of ours."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_drafter import G, _drafter, _target

from dspark_core.drafters.dspark import DraftConfig, DSparkDraftModel
from dspark_core.drafters.dspark_layout import expected_names, load_drafter, save_drafter
from dspark_core.errors import DSparkError
from dspark_core.verification.sampling import SamplingParams


def _block(m: DSparkDraftModel):
    torch.manual_seed(7)
    hidden = torch.randn(1, 9, m.cfg.context_width)
    feats = m.context_features(hidden)
    ctx = m.context_kv(feats, torch.arange(9)[None])
    return m.forward_blocks(torch.tensor([5]), torch.tensor([9]), ctx, torch.ones(1, 9, dtype=torch.bool), G)


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
def test_round_trip_through_the_engine_layout_changes_nothing(head: str, tmp_path) -> None:
    target = _target()
    m = _drafter(head, target)
    save_drafter(m, tmp_path / "d", dtype=torch.float32, target_layers=3, max_positions=4096)
    back = load_drafter(tmp_path / "d", target)
    assert back.cfg == m.cfg
    a, b = _block(m), _block(back)
    torch.testing.assert_close(a.base_logits, b.base_logits, rtol=0, atol=0)
    da = m.draft(a, torch.tensor([5]), [SamplingParams()])
    db = back.draft(b, torch.tensor([5]), [SamplingParams()])
    assert torch.equal(da.tokens, db.tokens)
    torch.testing.assert_close(da.confidence_logits, db.confidence_logits, rtol=0, atol=0)


def test_config_has_what_both_engines_read(tmp_path) -> None:
    target = _target()
    save_drafter(_drafter("rnn", target), tmp_path / "d", target_layers=3, max_positions=4096)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    # SGLang: AutoConfig must know model_type; vLLM: any other DSpark architecture becomes DeepSeek-V4's
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    # top level only: SGLang's model builder (markov_*), vLLM's num_speculative_tokens default (block_size),
    # vLLM refuses sample_from_anchor inside dflash_config
    for key in ("block_size", "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "sample_from_anchor"):
        assert key in cfg and key not in cfg["dflash_config"] or key == "block_size"
    assert cfg["markov_head_type"] == "rnn" and cfg["sample_from_anchor"] is True
    assert cfg["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert cfg["dflash_config"]["mask_token_id"] < cfg["vocab_size"] and cfg["block_size"] == G
    names = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert names == expected_names(_drafter("rnn", target).cfg)
    assert not any(n.startswith(("model.", "embed_tokens", "lm_head")) for n in names)  # vLLM adds "model."


def test_head_none_ships_as_a_vanilla_head_that_adds_nothing(tmp_path) -> None:
    target = _target()
    save_drafter(_drafter("none", target), tmp_path / "d", target_layers=3)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    w2 = load_file(str(tmp_path / "d" / "model.safetensors"))["markov_head.markov_w2.weight"]
    assert cfg["markov_head_type"] == "vanilla" and cfg["markov_rank"] > 0 and not w2.any()
    assert load_drafter(tmp_path / "d", target).cfg.head == "none"


def test_incomplete_or_foreign_checkpoints_are_refused(tmp_path) -> None:
    target = _target()
    save_drafter(_drafter("markov", target), tmp_path / "d", target_layers=3)
    path = tmp_path / "d" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["fc.weight"]  # both engines would load this silently and run an uninitialised projection
    save_file(tensors, str(path))
    with pytest.raises(DSparkError, match="lack .*fc.weight"):
        load_drafter(tmp_path / "d", target)
    cfg_path = tmp_path / "d" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "markov_head_type": "gated"}))
    with pytest.raises(DSparkError, match="gated"):
        load_drafter(tmp_path / "d", target)


def test_a_learned_mask_vector_cannot_be_exported(tmp_path) -> None:
    target = _target()
    cfg = DraftConfig.for_target(target.arch, block_size=G, markov_rank=8, num_layers=1, mask_token_id=None)
    with pytest.raises(DSparkError, match="retrain"):
        save_drafter(DSparkDraftModel(cfg, target.embed, target.lm_head), tmp_path / "d")


def test_mask_slots_embed_the_mask_token_with_the_targets_table() -> None:
    target = _target()
    m = _drafter("markov", target)
    x = m.block_inputs(torch.tensor([5, 6]), G)
    assert "mask_embed" not in dict(m.named_parameters())
    torch.testing.assert_close(x[:, 1:], target.embed.weight[m.cfg.mask_token_id].expand(2, G - 1, -1))
