"""The simulator's published acceptance prior: Table 1 level, Figure 4 shape over gamma, Figure 3 depth."""

from __future__ import annotations

import pytest

from profiler.build import build_profile
from tuner.acceptance import _fig4, acceptance_for, depth_ratio, expected_tau, fit_geometric


@pytest.mark.parametrize("domain, table1", [("chat", 3.503), ("code", 5.283), ("math", 5.653)])
def test_prior_matches_table1_at_gamma7_and_figure4_shape(domain: str, table1: float) -> None:
    profile = build_profile("qwen3-8b", "h100", domain, measure=False)
    model = acceptance_for(profile, "markov", draft_layers=5)
    assert model.tau(7) == pytest.approx(table1, abs=0.01)
    gammas, taus = _fig4(domain, "markov")
    for g, t in zip(gammas, taus, strict=True):  # growth relative to gamma 7 follows Figure 4 within 5 %
        assert model.tau(g) / model.tau(7) == pytest.approx(t / taus[1], rel=0.05)
    assert "Fig. 4" in model.source


def test_depth_scales_tau_like_figure3() -> None:
    assert depth_ratio("chat", 5) == depth_ratio("chat", 8) == depth_ratio("chat", None) == 1.0
    assert depth_ratio("math", 1) < depth_ratio("math", 2) < depth_ratio("math", 3) < 1.0
    profile = build_profile("qwen3-8b", "h100", "code", measure=False)
    shallow, deep = (acceptance_for(profile, "markov", draft_layers=n) for n in (1, 5))
    assert shallow.tau(7) == pytest.approx(deep.tau(7) * depth_ratio("code", 1), abs=0.01)
    assert "draft layers" in shallow.source


def test_geometric_fit_reproduces_the_points() -> None:
    gammas, taus = [3, 7, 11, 15], [2.8, 3.49, 3.66, 3.7]
    a, d = fit_geometric(tuple(gammas), tuple(taus))
    assert all(abs(expected_tau([a * d**k for k in range(g)]) - t) < 0.06 for g, t in zip(gammas, taus, strict=True))
    assert 0.7 < a < 0.85 and d < 1.0  # chat saturates: acceptance decays with position


def test_rnn_keeps_its_figure4_edge_over_markov() -> None:
    profile = build_profile("qwen3-8b", "h100", "math", measure=False)
    assert acceptance_for(profile, "rnn").tau(15) > acceptance_for(profile, "markov").tau(15)
