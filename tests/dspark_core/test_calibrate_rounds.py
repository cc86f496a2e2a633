"""Offline greedy rounds (the STS and figure data) agree with drafting + verifying one block by hand."""

from __future__ import annotations

import torch
from conftest import random_model

from dspark_core.training.rounds import Rounds, simulate_greedy_rounds
from dspark_core.training.train import TrainConfig, build_model, generate_continuations
from dspark_core.verification.calibrate import fit_sts, survival_labels
from dspark_core.verification.sampling import SamplingParams


def test_rounds_statistics_hand_computed() -> None:
    r = Rounds(confidence_logits=torch.zeros(4, 3), accepted=torch.tensor([0, 1, 3, 2]))
    assert r.position_acceptance() == [0.75, 2 / 3, 0.5]
    assert r.tau(1) == 1.75 and r.tau(3) == 2.5


def test_simulated_rounds_match_a_hand_round() -> None:
    torch.set_num_threads(1)
    target = random_model(4, vocab=40)
    model = build_model(TrainConfig(head="rnn", block_size=4, num_layers=1, markov_rank=8, intermediate_size=32,
                                    target_layers=[0, 1]), target)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    prompts = torch.randint(1, 40, (3, 5), generator=torch.Generator().manual_seed(1))
    tokens = generate_continuations(target, prompts, 20, temperature=1.0, greedy_rows=3, seed=0)
    rounds = simulate_greedy_rounds(model, target, tokens, 5, anchors_per_seq=3, seed=7)
    assert rounds.confidence_logits.shape == (9, 4) and rounds.accepted.shape == (9,)
    gen = torch.Generator().manual_seed(7)
    anchors = torch.randint(4, 20 - 4 + 5, (3, 3), generator=gen)
    _, hidden = target.forward_full(tokens, hidden_layers=(0, 1))
    for n in range(3):
        for a in range(3):
            p = int(anchors[n, a])
            feats = model.context_features(hidden[n:n + 1, :p])
            ctx = model.context_kv(feats, torch.arange(p)[None])
            block = model.forward_blocks(tokens[n, p:p + 1], torch.tensor([p]), ctx,
                                         torch.ones(1, p, dtype=torch.bool), 4)
            out = model.draft(block, tokens[n, p:p + 1], [SamplingParams()])
            k = 0
            while k < 4 and int(out.tokens[0, k]) == int(tokens[n, p + 1 + k]):
                k += 1
            assert int(rounds.accepted[n * 3 + a]) == k
            torch.testing.assert_close(rounds.confidence_logits[n * 3 + a], out.confidence_logits[0], atol=1e-4,
                                       rtol=1e-4)
    fit = fit_sts(rounds.confidence_logits, survival_labels(rounds.accepted, 4))
    assert len(fit.temperatures) == 4
