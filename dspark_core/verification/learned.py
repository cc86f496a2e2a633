"""The learned verification-length scheduler (`spec.scheduler: learned`): Algorithm 1 over learned acceptances.

The seed's `lambda = RL_policy(load_level, entropy)`, built as a model-based contextual bandit that stays lossless.
Per drafted position the policy estimates P(x_{r,j} survives | x_{r,<j} survived) from what is known before
x_{r,j} is drawn: the calibrated confidence c_{r,j} (as a logit), the draft distribution's entropy at j, the
position and the request's rolling per-position acceptance. A logistic model of those features is fitted to
logged rounds, and a logit shift on top is chosen by the reward itself, committed tokens per second of the whole
batch priced by the SPS table (`dspark_core/training/train_policy.py`). The verify lengths are then Algorithm 1's
(the hardware-aware prefix scheduler with the early stop) on the estimated acceptances: the load, the SPS slope
and the engine's per-round overhead enter there, exactly priced, instead of being learned.

Losslessness: every estimate for position j reads only x_{r,<j} (c_{r,j} and the entropy at j are computed from
the previous draft token; the rest from past rounds), and Algorithm 1's early stop admits (r, j) without seeing
x_{r,j}. So the choice is a stopping rule and the output distribution is the target's (tests: the paper's
Appendix A counterexample and a small-vocabulary distribution test, test_schedulers_lossless.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from dspark_core.verification.acceptance_model import AcceptanceModel
from dspark_core.verification.schedulers import Confidences, PrefixDecision, prefix_schedule
from dspark_core.verification.sps import SpsTable

# phi(r, j), in this order; the policy file names them so a file from another feature set is refused
FEATURES = (
    "bias",  # 1
    "confidence_logit",  # logit of the calibrated c_{r,j} (clamped to [1e-4, 1 - 1e-4])
    "entropy",  # entropy (nats) of the draft distribution at j; the file's mean when the drafter gives none
    "position",  # j / 16
    "recent_acceptance",  # the request's rolling per-position acceptance (accepted / positions seen)
)

PRIOR_ACCEPT = 0.5  # a request's rolling per-position acceptance before its first round
ACCEPT_EMA = 0.3  # weight of the newest round in the rolling acceptance


@dataclass
class RollingAcceptance:
    """Per request: rolling (accepted, trials) with trials = min(verified, accepted + 1), the positions whose outcome
    was seen. Their ratio estimates the per-position acceptance whatever the verify lengths were (the regulator's
    accepted / verified is not: it rises when fewer tokens are verified), so a policy trained on verify_all logs sees
    the same feature when it runs. The engine and the simulator both keep one."""

    state: dict[int, tuple[float, float]] = field(default_factory=dict)  # request -> (accepted, trials), EMA'd

    def get(self, key: int) -> float:
        hits, trials = self.state.get(key, (PRIOR_ACCEPT, 1.0))
        return hits / trials

    def observe(self, key: int, verified: int, accepted: int) -> None:
        trials = min(verified, accepted + 1)
        if trials:
            hits, tried = self.state.get(key, (PRIOR_ACCEPT, 1.0))
            self.state[key] = ((1 - ACCEPT_EMA) * hits + ACCEPT_EMA * accepted,
                               (1 - ACCEPT_EMA) * tried + ACCEPT_EMA * trials)

    def drop(self, key: int) -> None:
        self.state.pop(key, None)


@dataclass
class RoundContext:
    """What the engine knows of the round besides the confidences (missing entries are neutral)."""

    recent_acceptance: Sequence[float] = ()  # per request: rolling per-position acceptance
    entropy: Sequence[Sequence[float]] = ()  # per request and position: draft entropy in nats


class PolicyFile(AcceptanceModel):
    """The JSON the bundle ships for `spec.scheduler: learned`."""

    FEATURE_NAMES: ClassVar[tuple[str, ...]] = FEATURES
    TRAIN_COMMAND: ClassVar[str] = "train-policy"

    gamma: int  # block length of the logged rounds


def feature_rows(rows: Confidences, ctx: RoundContext, mean_entropy: float) -> list[list[list[float]]]:
    """phi[r][j] (FEATURES order) for every drafted position of every request."""
    out = []
    for r, conf in enumerate(rows):
        acc = float(ctx.recent_acceptance[r]) if r < len(ctx.recent_acceptance) else PRIOR_ACCEPT
        ent = ctx.entropy[r] if r < len(ctx.entropy) else ()
        feats = []
        for j, c in enumerate(conf):
            c = min(1.0 - 1e-4, max(1e-4, float(c)))
            feats.append([1.0, math.log(c / (1.0 - c)), float(ent[j]) if j < len(ent) else mean_entropy, j / 16.0,
                          acc])
        out.append(feats)
    return out


@dataclass
class LearnedScheduler:
    """Algorithm 1 (early stop, lossless) on the policy's acceptance estimates instead of the raw confidences."""

    policy: PolicyFile  # trained acceptance model
    sps: SpsTable  # profiled cost table
    name: str = "learned"
    overhead_s: float = 0.0  # fixed cost per round on top of the target step (the engine measures it online)
    context: RoundContext = field(default_factory=RoundContext)  # set by the engine before each schedule()
    last: PrefixDecision | None = None  # the latest decision, for stats

    def estimates(self, rows: Confidences) -> list[list[float]]:
        mean_entropy = self.policy.mean[FEATURES.index("entropy")]
        return [[self.policy.acceptance(phi) for phi in feats]
                for feats in feature_rows(rows, self.context, mean_entropy)]

    def schedule(self, rows: Confidences) -> list[int]:
        self.last = prefix_schedule(self.estimates(rows), self.sps, early_stop=True, overhead_s=self.overhead_s)
        return self.last.lengths

    def reset(self) -> None:
        self.context, self.last = RoundContext(), None
