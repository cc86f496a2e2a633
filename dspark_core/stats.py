"""Generation statistics: throughput, tau, per-position conditional acceptance, verify tokens per step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenStats:
    """Counters of one `Engine.generate` call (JSON-friendly via `summary()`)."""

    method: str = "plain"  # drafter name, or plain
    requests: int = 0  # prompts generated
    generated_tokens: int = 0  # output tokens over all requests
    seconds: float = 0.0  # wall time of the whole call (prefill + decode)
    rounds: int = 0  # speculative rounds, summed over requests (one target verify each)
    round_tokens: int = 0  # tokens committed by rounds (excludes the token sampled at prefill)
    steps: int = 0  # target forwards of the decode loop (one per round of the whole batch)
    verify_tokens: int = 0  # tokens the target processed in decode forwards (anchor + verified drafts)
    proposed: int = 0  # draft tokens proposed
    verified: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens accepted
    drafts: int = 0  # request rounds that verified at least one draft token
    pos_attempts: list[int] = field(default_factory=list)  # per draft position: verified with prefix accepted
    pos_accepts: list[int] = field(default_factory=list)  # per draft position: accepted
    cut: int = 0  # requests stopped unfinished by generate()'s time limit
    draft_s: float = 0.0  # host wall time in the drafter (propose + scheduler), decode steps only
    verify_s: float = 0.0  # host wall time of the target's verify forwards and their verdicts
    decode_s: float = 0.0  # wall time of the decode rounds (all but the prefills run apart from a round)
    admit_rounds: int = 0  # rounds whose verify forward also prefilled requests admitted while others ran
    mixed_s: float = 0.0  # wall time of those rounds (decode_s holds it too)
    full_s: float = 0.0  # wall time of the decode rounds every batch slot took part in
    full_tokens: int = 0  # tokens those rounds committed

    def record(self, verified: int, accepted: int, committed: int, proposed: int) -> None:
        """Account one request's round."""
        self.rounds += 1
        self.round_tokens += committed
        self.proposed += proposed
        self.verified += verified
        self.accepted += accepted
        self.drafts += verified > 0
        need = min(accepted + 1, verified)
        while len(self.pos_attempts) < need:
            self.pos_attempts.append(0)
            self.pos_accepts.append(0)
        for j in range(need):
            self.pos_attempts[j] += 1
            if j < accepted:
                self.pos_accepts[j] += 1

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens committed by decode rounds per second of decode rounds: the speed with prefill left out."""
        return self.round_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def full_tokens_per_s(self) -> float:
        """Tokens per second of the rounds with every batch slot busy: a server's speed under sustained load, where
        a closed batch of prompts ends with a tail of a few requests running alone."""
        return self.full_tokens / self.full_s if self.full_s > 0 else 0.0

    @property
    def tau(self) -> float:
        """Accepted tokens per round including the target's own token (1.0 for plain decoding)."""
        return self.round_tokens / self.rounds if self.rounds else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """P(draft position j accepted | positions < j accepted and j verified), j = 1..gamma."""
        return [a / n if n else 0.0 for a, n in zip(self.pos_accepts, self.pos_attempts, strict=True)]

    @property
    def verify_tokens_per_step(self) -> float:
        """Mean tokens per target decode forward (batch x (1 + verified drafts))."""
        return self.verify_tokens / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, object]:
        """The figures a report or the bench prints."""
        return {
            "method": self.method,
            "requests": self.requests,
            "generated_tokens": self.generated_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "tau": round(self.tau, 4),
            "position_acceptance": [round(x, 4) for x in self.position_acceptance],
            "verify_tokens_per_step": round(self.verify_tokens_per_step, 3),
            "admit_rounds": self.admit_rounds,
            "acceptance_rate": round(self.accepted / self.verified, 4) if self.verified else 0.0,
        }
