"""DSpark drafter network with random small weights: shapes, packing == per-block inference,
causality of the sequential heads, head `none` == the pure parallel drafter, save / load."""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters.dspark import DraftConfig, DSparkDraftModel
from dspark_core.drafters.dspark_layout import load_drafter, save_drafter
from dspark_core.errors import DSparkError
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.model import LeanModel
from dspark_core.verification.sampling import SamplingParams

V, H, G = 64, 32, 4


def _target() -> LeanModel:
    torch.manual_seed(0)
    arch = ArchConfig(model_type="qwen3", vocab_size=V, hidden_size=H, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                      qk_norm=True)
    return LeanModel(arch).eval()


def _drafter(head: str, target: LeanModel, seed: int = 1) -> DSparkDraftModel:
    torch.manual_seed(seed)
    cfg = DraftConfig.for_target(target.arch, block_size=G, head=head, markov_rank=8, num_layers=2,
                                 intermediate_size=40)
    m = DSparkDraftModel(cfg, target.embed, target.lm_head)
    with torch.no_grad():  # non-trivial heads (W2 starts at zero)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def _ctx_for(m: DSparkDraftModel, hidden: torch.Tensor, p: int):
    """Per-layer context K/V of positions < p for a single sequence."""
    feats = m.context_features(hidden[None, :p])
    return m.context_kv(feats, torch.arange(p)[None])


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
def test_packed_training_forward_equals_one_block_at_a_time(head: str) -> None:
    target = _target()
    m = _drafter(head, target)
    torch.manual_seed(2)
    tokens = torch.randint(1, V, (2, 20))
    _, hidden = target.forward_full(tokens, hidden_layers=tuple(m.cfg.target_layers))
    anchors = torch.tensor([[1, 7, 12], [3, 9, 15]])
    with torch.no_grad():
        packed = m.forward_packed(tokens, hidden, anchors)
        assert packed.base_logits.shape == (2, 3, G, V) and packed.hidden.shape == (2, 3, G, H)
        for n in range(2):
            for a in range(3):
                p = int(anchors[n, a])
                ctx = _ctx_for(m, hidden[n], p)
                one = m.forward_blocks(tokens[n, p:p + 1], torch.tensor([p]), ctx,
                                       torch.ones(1, p, dtype=torch.bool), G)
                torch.testing.assert_close(one.base_logits[0], packed.base_logits[n, a], atol=1e-4, rtol=1e-4)


def test_padded_context_in_a_batch_changes_nothing() -> None:
    target = _target()
    m = _drafter("markov", target)
    tokens = torch.randint(1, V, (1, 16))
    _, hidden = target.forward_full(tokens, hidden_layers=tuple(m.cfg.target_layers))
    with torch.no_grad():
        alone = m.forward_blocks(tokens[0, 5:6], torch.tensor([5]), _ctx_for(m, hidden[0], 5),
                                 torch.ones(1, 5, dtype=torch.bool), G)
        ctx9 = _ctx_for(m, hidden[0], 9)  # a longer row in the same batch; row 0 padded to 9
        ctx = [(torch.cat([k, k]), torch.cat([v, v])) for k, v in ctx9]
        valid = torch.ones(2, 9, dtype=torch.bool)
        valid[0, 5:] = False
        both = m.forward_blocks(torch.stack([tokens[0, 5], tokens[0, 9]]), torch.tensor([5, 9]), ctx, valid, G)
    torch.testing.assert_close(both.base_logits[0], alone.base_logits[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_sequential_head_is_causal(head: str) -> None:
    target = _target()
    m = _drafter(head, target)
    block = m.forward_blocks(torch.tensor([3]), torch.tensor([4]), _ctx_for(m, torch.randn(8, m.cfg.context_width), 4),
                             torch.ones(1, 4, dtype=torch.bool), G)
    prev = torch.tensor([[3, 10, 20, 30]])
    with torch.no_grad():
        base, conf = m.teacher_forced(block, prev)
        for j in range(1, G):
            changed = prev.clone()
            changed[0, j] = 50
            logits, c = m.teacher_forced(block, changed)
            torch.testing.assert_close(logits[0, :j], base[0, :j])  # positions before j do not see x_j
            torch.testing.assert_close(c[0, :j], conf[0, :j])
            assert not torch.allclose(logits[0, j], base[0, j])  # position j does
    if head == "markov":  # B_k = W1[x_{k-1}] W2
        expect = block.base_logits[0] + m.head.w1.weight[prev[0]] @ m.head.w2.weight.T
        torch.testing.assert_close(base[0], expect, atol=1e-4, rtol=1e-4)


def test_head_none_is_the_pure_parallel_drafter() -> None:
    target = _target()
    m = _drafter("none", target)
    block = m.forward_blocks(torch.tensor([3, 7]), torch.tensor([4, 4]),
                             [(torch.cat([k, k]), torch.cat([v, v])) for k, v in
                              _ctx_for(m, torch.randn(8, m.cfg.context_width), 4)],
                             torch.ones(2, 4, dtype=torch.bool), G)
    out = m.draft(block, torch.tensor([3, 7]), [SamplingParams()] * 2)
    assert torch.equal(out.tokens, block.base_logits.argmax(-1)) and out.probs is None
    logits, _ = m.teacher_forced(block, torch.randint(0, V, (2, G)))
    torch.testing.assert_close(logits, block.base_logits)


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
def test_left_to_right_draft_matches_teacher_forcing_on_its_own_tokens(head: str) -> None:
    target = _target()
    m = _drafter(head, target)
    ctx = _ctx_for(m, torch.randn(8, m.cfg.context_width), 6)
    block = m.forward_blocks(torch.tensor([5]), torch.tensor([6]), ctx, torch.ones(1, 6, dtype=torch.bool), G)
    greedy = m.draft(block, torch.tensor([5]), [SamplingParams()])
    prev = torch.cat([torch.tensor([[5]]), greedy.tokens[:, :-1]], dim=1)
    logits, conf = m.teacher_forced(block, prev)
    assert torch.equal(logits.argmax(-1), greedy.tokens)
    torch.testing.assert_close(conf, greedy.confidence_logits)
    # sampling: q is a distribution, the token has mass under it, and a seeded generator reproduces it
    sp = SamplingParams(temperature=0.8, top_k=20)
    a = m.draft(block, torch.tensor([5]), [sp], [torch.Generator().manual_seed(3)])
    b = m.draft(block, torch.tensor([5]), [sp], [torch.Generator().manual_seed(3)])
    assert torch.equal(a.tokens, b.tokens) and a.probs is not None
    torch.testing.assert_close(a.probs.sum(-1), torch.ones(1, G))
    assert bool((a.probs[0].gather(-1, a.tokens[0][:, None]) > 0).all())
    prev = torch.cat([torch.tensor([[5]]), a.tokens[:, :-1]], dim=1)
    logits, _ = m.teacher_forced(block, prev)
    from dspark_core.verification.sampling import sampling_probs

    torch.testing.assert_close(sampling_probs(logits[0], sp), a.probs[0])


def test_save_load_round_trip_keeps_shared_weights_out(tmp_path) -> None:
    target = _target()
    m = _drafter("rnn", target)
    save_drafter(m, tmp_path / "d", dtype=torch.float32)
    from safetensors.torch import load_file

    names = load_file(str(tmp_path / "d" / "model.safetensors")).keys()
    assert not any(n.startswith(("embed", "lm_head", "_shared")) for n in names)
    m2 = load_drafter(tmp_path / "d", target)
    for (k1, v1), (k2, v2) in zip(m.state_dict().items(), m2.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2)
    assert m2.embed is target.embed
    with pytest.raises(DSparkError, match="no DSpark drafter"):
        load_drafter(tmp_path / "missing", target)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="head"):
        DraftConfig(vocab_size=V, hidden_size=H, target_layers=[0], head="lstm")
    with pytest.raises(ValueError, match="target_layers"):
        DraftConfig(vocab_size=V, hidden_size=H, target_layers=[])
