"""Gamma regulator and fallback: decisions from past rounds only, within the configured range."""

from __future__ import annotations

import pytest

from dspark_core.verification.regulator import GammaRegulator, RegulatorConfig


def test_gamma_grows_on_full_accepts_and_shrinks_on_poor_rounds() -> None:
    reg = GammaRegulator(RegulatorConfig(gamma_min=2, gamma_max=6, shrink_below=0.5))
    assert reg.gamma_for(1) == 6
    for _ in range(10):
        g = reg.gamma_for(1)
        reg.observe(1, verified=g, accepted=0)
    assert reg.gamma_for(1) == 2  # never below gamma_min
    for _ in range(20):
        g = reg.gamma_for(1)
        reg.observe(1, verified=g, accepted=g)
    assert reg.gamma_for(1) == 6  # never above gamma_max


def test_non_adaptive_always_drafts_gamma_max() -> None:
    reg = GammaRegulator(RegulatorConfig(gamma_max=5, adaptive=False))
    for _ in range(5):
        reg.observe(7, verified=5, accepted=0)
    assert reg.gamma_for(7) == 5


def test_fallback_to_plain_decoding_and_recovery() -> None:
    cfg = RegulatorConfig(gamma_min=1, gamma_max=4, fallback_floor=0.3, hysteresis=0.1, probe_every=3,
                          ema=0.5)
    reg = GammaRegulator(cfg)
    rounds = 0
    while reg.gamma_for(0) > 0:
        reg.observe(0, verified=reg.gamma_for(0), accepted=0)
        rounds += 1
        assert rounds < 10
    assert reg.states[0].fallback
    # plain rounds until the probe
    for _ in range(3):
        assert reg.gamma_for(0) == 0
        reg.observe(0, verified=0, accepted=0)
    probe = reg.gamma_for(0)
    assert probe >= 1
    # good probes bring it back once the rolling rate clears floor + hysteresis
    for _ in range(6):
        g = reg.gamma_for(0)
        if g == 0:
            reg.observe(0, verified=0, accepted=0)
        else:
            reg.observe(0, verified=g, accepted=g)
    assert not reg.states[0].fallback and reg.gamma_for(0) >= 1
    reg.drop(0)
    assert 0 not in reg.states


def test_requests_are_independent_and_config_is_validated() -> None:
    reg = GammaRegulator(RegulatorConfig(gamma_max=4, shrink_below=0.9))
    reg.observe(1, verified=4, accepted=0)
    assert reg.gamma_for(1) == 3 and reg.gamma_for(2) == 4
    reg.reset()
    assert reg.states == {}
    with pytest.raises(ValueError):
        RegulatorConfig(gamma_min=5, gamma_max=4)
