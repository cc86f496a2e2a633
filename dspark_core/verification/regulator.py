"""Per-request block length (the gamma regulator) and the fallback to plain decoding.

Both decide how many tokens a request drafts *before* the round is drafted, from accept counts of
past rounds only, so they never touch losslessness. The regulator nudges gamma inside the configured
range: up by one after a round that accepted the whole block, down by one when the rolling acceptance
says the tail of the block is mostly wasted. The fallback switches a request to plain decoding
(gamma = 0) while its rolling acceptance stays under a floor; every `probe_every` rounds it drafts a
probe block, and it resumes once the rolling acceptance is back above floor + hysteresis.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RegulatorConfig:
    """Knobs of the regulator; `spec.block_size` is gamma_max, `spec.fallback_acceptance` the floor."""

    gamma_min: int = 1  # smallest block a speculating request drafts
    gamma_max: int = 7  # largest block (the drafter's trained block length)
    adaptive: bool = True  # false: always draft gamma_max (no regulation)
    shrink_below: float = 0.35  # shrink gamma when rolling acceptance rate (accepted/proposed) is below this
    fallback_floor: float = 0.0  # rolling acceptance below this -> plain decoding (0 disables fallback)
    hysteresis: float = 0.05  # resume speculation only above floor + this
    probe_every: int = 8  # in fallback, draft a probe block every this many rounds
    ema: float = 0.3  # weight of the newest round in the rolling acceptance

    def __post_init__(self) -> None:
        if not 1 <= self.gamma_min <= self.gamma_max:
            raise ValueError(f"need 1 <= gamma_min <= gamma_max, got {self.gamma_min}, {self.gamma_max}")
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {self.ema}")


@dataclass
class RequestState:
    """Rolling statistics of one request."""

    gamma: int  # block length for the next round
    rate: float = 1.0  # rolling acceptance rate: accepted draft tokens / verified draft tokens
    fallback: bool = False  # true: plain decoding
    rounds_in_fallback: int = 0  # rounds since the last probe


@dataclass
class GammaRegulator:
    """Tracks every request; the engine asks `gamma_for` before drafting and calls `observe` after."""

    config: RegulatorConfig = field(default_factory=RegulatorConfig)
    states: dict[int, RequestState] = field(default_factory=dict)  # request id -> state

    def _state(self, rid: int) -> RequestState:
        if rid not in self.states:
            self.states[rid] = RequestState(gamma=self.config.gamma_max)
        return self.states[rid]

    def gamma_for(self, rid: int) -> int:
        """Draft tokens request `rid` should propose this round (0 = plain decoding step)."""
        st = self._state(rid)
        if st.fallback:
            return st.gamma if st.rounds_in_fallback >= self.config.probe_every else 0
        return st.gamma if self.config.adaptive else self.config.gamma_max

    def observe(self, rid: int, verified: int, accepted: int) -> None:
        """Record a round: `verified` draft tokens sent to the target, `accepted` of them kept."""
        cfg, st = self.config, self._state(rid)
        if verified <= 0:
            if st.fallback:
                st.rounds_in_fallback += 1
            return
        rate = min(1.0, accepted / verified)
        st.rate = (1.0 - cfg.ema) * st.rate + cfg.ema * rate
        if cfg.adaptive:
            if accepted >= verified and verified >= st.gamma:
                st.gamma = min(cfg.gamma_max, st.gamma + 1)
            elif st.rate < cfg.shrink_below:
                st.gamma = max(cfg.gamma_min, st.gamma - 1)
        if st.fallback:
            st.rounds_in_fallback = 0
            if st.rate >= cfg.fallback_floor + cfg.hysteresis:
                st.fallback = False
        elif cfg.fallback_floor > 0.0 and st.rate < cfg.fallback_floor:
            st.fallback = True
            st.rounds_in_fallback = 0

    def drop(self, rid: int) -> None:
        """Forget a finished request."""
        self.states.pop(rid, None)

    def reset(self) -> None:
        self.states.clear()
