"""Drafter training on a small random target: the loss terms, learning, checkpoints and exact resume."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from dspark_core.drafters.dspark_layout import load_drafter
from dspark_core.errors import DSparkError
from dspark_core.training.train import (
    STATE_FILE,
    LossWeights,
    TrainConfig,
    TrainData,
    build_model,
    cache_target,
    drafter_loss,
    evaluate_acceptance,
    generate_continuations,
    position_weights,
    train_drafter,
    warm_start,
)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return random_model(3, vocab=40)


@pytest.fixture(scope="module")
def data(target) -> TrainData:
    prompts = torch.randint(1, 40, (24, 6), generator=torch.Generator().manual_seed(0))
    tokens = generate_continuations(target, prompts, 26, temperature=1.0, greedy_rows=12, seed=0)
    return TrainData(tokens=tokens, prompt_len=6)


def _cfg(**kw) -> TrainConfig:
    base = dict(head="markov", block_size=4, num_layers=1, markov_rank=8, intermediate_size=32, steps=40,
                batch_seqs=8, anchors_per_seq=4, lr=1e-2, warmup=5, checkpoint_every=10, target_layers=[0, 1])
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_position_weights() -> None:
    w = position_weights(4)
    assert w[0] == 1.0 and torch.allclose(w, torch.exp(-torch.arange(4) / 4.0))


def test_continuations_are_the_targets_greedy_tokens(target, data) -> None:
    tokens = data.tokens
    assert tokens.shape == (24, 32)
    logits, _ = target.forward_full(tokens[:12])
    # greedy rows: every generated token is the argmax after its prefix
    assert torch.equal(logits[:, 5:-1].argmax(-1), tokens[:12, 6:])


def test_loss_terms_and_perfect_match(target, data) -> None:
    model = build_model(_cfg(), target)
    tokens = data.tokens[:4]
    t_logits, hidden = target.forward_full(tokens, hidden_layers=(0, 1))
    anchors = torch.tensor([[5, 9], [6, 12], [20, 27], [5, 5]])
    loss, stats = drafter_loss(model, tokens, t_logits, hidden, anchors, LossWeights())
    assert loss.requires_grad and set(stats) >= {"ce", "tv", "conf", "accept"}
    assert 0.0 <= stats["accept"] <= 1.0 and stats["tv"] > 0
    expect = 0.1 * stats["ce"] + 0.9 * stats["tv"] + 1.0 * stats["conf"]
    assert float(loss.detach()) == pytest.approx(expect, rel=1e-5)


def test_kl_term_is_the_forward_kl_to_the_target(target, data) -> None:
    model = build_model(_cfg(), target)
    tokens = data.tokens[:4]
    t_logits, hidden = target.forward_full(tokens, hidden_layers=(0, 1))
    anchors = torch.tensor([[5, 9], [6, 12], [20, 27], [5, 5]])
    paper, stats = drafter_loss(model, tokens, t_logits, hidden, anchors, LossWeights())
    both, stats_kl = drafter_loss(model, tokens, t_logits, hidden, anchors, LossWeights(kl=2.0))
    assert stats_kl["kl"] == pytest.approx(stats["kl"]) and stats["kl"] > 0
    assert float(both.detach()) == pytest.approx(float(paper.detach()) + 2.0 * stats["kl"], rel=1e-5)
    # by hand at one block: sum_k w_k KL(p_t,k || p_d,k) with p_t the target at the draft positions
    g = model.cfg.block_size
    one = torch.tensor([[5]])
    _, s1 = drafter_loss(model, tokens[:1], t_logits[:1], hidden[:1], one, LossWeights())
    block = model.forward_packed(tokens[:1], hidden[:1], one)
    logits, _ = model.teacher_forced(block, tokens[:1, 5:5 + g][None])
    p_t = torch.softmax(t_logits[0, 5:5 + g].float(), -1)
    kl = (p_t * (p_t.log() - torch.log_softmax(logits[0, 0].float(), -1))).sum(-1)
    assert s1["kl"] == pytest.approx(float((kl * position_weights(g)).sum().detach()), rel=1e-4)


def test_prompt_anchors_reach_into_the_prompt(target, data, tmp_path, monkeypatch) -> None:
    import dspark_core.training.train as train_mod

    seen: list[tuple[int, int]] = []
    real = train_mod.sample_anchors

    def spy(n: int, a: int, lo: int, hi: int, gen: torch.Generator) -> torch.Tensor:
        seen.append((lo, hi))
        return real(n, a, lo, hi, gen)

    monkeypatch.setattr(train_mod, "sample_anchors", spy)
    train_drafter(target, data, _cfg(steps=1), tmp_path / "gen")
    train_drafter(target, data, _cfg(steps=1, prompt_anchors=True), tmp_path / "all")
    assert seen == [(5, 32 - 1 - 4), (1, 32 - 1 - 4)]


def test_cached_top_k_target_matches_the_dense_loss(target, data) -> None:
    model = build_model(_cfg(), target)
    cached = cache_target(target, TrainData(tokens=data.tokens[:4], prompt_len=6), (0, 1), k=40)  # K = V
    assert cached.hidden is not None and cached.hidden.shape[:2] == (4, 32)
    t_logits, hidden = target.forward_full(data.tokens[:4], hidden_layers=(0, 1))
    anchors = torch.tensor([[5, 9], [6, 12], [20, 27], [5, 5]])
    dense, _ = drafter_loss(model, data.tokens[:4], t_logits, hidden, anchors, LossWeights())
    sparse, _ = drafter_loss(model, data.tokens[:4], None, cached.hidden.float(), anchors, LossWeights(),
                             (cached.top_probs, cached.top_ids))
    assert float(sparse.detach()) == pytest.approx(float(dense.detach()), rel=2e-3)
    small = cache_target(target, TrainData(tokens=data.tokens[:4], prompt_len=6), (0, 1), k=8)
    torch.testing.assert_close(small.top_probs.float().sum(-1), torch.ones(4, 32), atol=2e-3, rtol=0)


def test_training_on_cached_target_outputs(target, data, tmp_path) -> None:
    cached = cache_target(target, data, (0, 1), k=16)
    losses: list[float] = []
    train_drafter(target, cached, _cfg(steps=30), tmp_path, on_step=lambda s, st: losses.append(st["loss"]))
    assert sum(losses[-5:]) < sum(losses[:5])
    with pytest.raises(ValueError, match="layers"):
        train_drafter(target, cache_target(target, data, (1,), k=4), _cfg(steps=2), tmp_path / "x")


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
def test_training_improves_acceptance_and_saves_a_loadable_drafter(head: str, target, data, tmp_path) -> None:
    cfg = _cfg(head=head, steps=60)
    before = evaluate_acceptance(build_model(cfg, target), target, data)
    losses: list[float] = []
    model = train_drafter(target, data, cfg, tmp_path, on_step=lambda s, st: losses.append(st["loss"]))
    after = evaluate_acceptance(model, target, data)
    assert len(losses) == 60 and sum(losses[-10:]) < sum(losses[:10])
    assert sum(after) > sum(before)
    loaded = load_drafter(tmp_path, target)
    assert loaded.cfg.head == head and (tmp_path / STATE_FILE).is_file()


def test_resume_reproduces_an_uninterrupted_run(target, data, tmp_path) -> None:
    cfg = _cfg(steps=20, checkpoint_every=5)
    straight = train_drafter(target, data, cfg, tmp_path / "a")

    class Stop(Exception):
        pass

    def crash(step: int, _stats: dict[str, float]) -> None:
        if step == 13:
            raise Stop

    with pytest.raises(Stop):
        train_drafter(target, data, cfg, tmp_path / "b", on_step=crash)
    assert torch.load(tmp_path / "b" / STATE_FILE, weights_only=False)["step"] == 10
    resumed = train_drafter(target, data, cfg, tmp_path / "b")
    for (k, v1), (_, v2) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        torch.testing.assert_close(v1, v2, msg=k)


def test_warm_start_begins_at_the_drafters_weights_and_records_it(target, data, tmp_path) -> None:
    first = train_drafter(target, data, _cfg(steps=20), tmp_path / "a", data_recipe={"seed": 0})
    init = warm_start(tmp_path / "a", target, _cfg(steps=20, lr=0.0))
    assert init.source["drafter"] == "a" and init.source["steps"] == 20
    assert init.source["data"][0]["recipe"] == {"seed": 0}
    # lr 0: the new run's drafter is the one it started from (within the fp16 the folder stores)
    again = train_drafter(target, data, _cfg(steps=3, lr=0.0), tmp_path / "b", init=init, data_recipe={"seed": 1})
    for (k, v1), (_, v2) in zip(first.state_dict().items(), again.state_dict().items(), strict=True):
        torch.testing.assert_close(v1.float(), v2.float(), atol=2e-3, rtol=2e-3, msg=k)
    extra = load_drafter(tmp_path / "b", target).cfg.extra
    assert extra["init_from"]["drafter"] == "a" and extra["data"] == [{"from_step": 0, "recipe": {"seed": 1}}]
    with pytest.raises(DSparkError, match="markov_rank 8 / 16"):
        warm_start(tmp_path / "a", target, _cfg(markov_rank=16))


def test_average_of_two_drafters_is_their_mean_and_refuses_other_shapes(target, data, tmp_path) -> None:
    from dspark_core.drafters.dspark_layout import save_drafter
    from dspark_core.training.average import average_drafters

    a = train_drafter(target, data, _cfg(steps=4), tmp_path / "a")
    b = train_drafter(target, data, _cfg(steps=4, seed=1), tmp_path / "b")
    mean = average_drafters(tmp_path / "a", tmp_path / "b", 0.25, target)
    for (k, va), (_, vb), (_, vm) in zip(a.state_dict().items(), b.state_dict().items(), mean.state_dict().items(),
                                         strict=True):
        torch.testing.assert_close(vm.float(), 0.25 * va.float() + 0.75 * vb.float(), atol=2e-3, rtol=2e-3, msg=k)
    save_drafter(mean, tmp_path / "m")
    assert load_drafter(tmp_path / "m", target).cfg.extra["averaged"]["first"]["drafter"] == "a"
    train_drafter(target, data, _cfg(steps=2, markov_rank=4), tmp_path / "c")
    with pytest.raises(DSparkError, match="markov_rank 8 / 4"):
        average_drafters(tmp_path / "a", tmp_path / "c", 0.5, target)
    with pytest.raises(DSparkError, match="strictly between 0 and 1"):
        average_drafters(tmp_path / "a", tmp_path / "b", 1.0, target)


def test_deadline_stops_early_with_a_resumable_checkpoint(target, data, tmp_path) -> None:
    steps: list[int] = []
    train_drafter(target, data, _cfg(steps=50), tmp_path, on_step=lambda s, _st: steps.append(s), deadline=0.0)
    assert steps == [1]
    assert torch.load(tmp_path / STATE_FILE, weights_only=False)["step"] == 1
    assert load_drafter(tmp_path, target).cfg.block_size == 4


def test_too_short_sequences_are_rejected(target, data, tmp_path) -> None:
    short = TrainData(tokens=data.tokens[:, :8], prompt_len=6)
    with pytest.raises(ValueError, match="too short"):
        train_drafter(target, short, _cfg(), tmp_path)
