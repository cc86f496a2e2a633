"""Engine side of the schedulers: the `VerifyScheduler` the round loop calls (drafters/base.py).

It ties together, per round: the gamma regulator and fallback (how many tokens each request drafts,
regulator.py), a verification-length policy (schedulers.py) fed with the drafter's calibrated
confidences, and the SPS table (sps.py) that the prefix / async_topk policies need: loaded from
`spec.sps_path` when given, else profiled on the target when the engine starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dspark_core.regulator import GammaRegulator, RegulatorConfig
from dspark_core.schedulers import Scheduler, make_scheduler
from dspark_core.sps import SpsTable, default_probes, profile_sps

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig
    from dspark_core.drafters.base import DraftRequest, Proposal, RoundResult
    from dspark_core.model import LeanModel


@dataclass
class EngineScheduler:
    """VerifyScheduler over a policy from schedulers.py plus the regulator."""

    policy: Scheduler  # verify_all | threshold | prefix | async_topk
    regulator: GammaRegulator  # per-request block length and plain-decoding fallback
    max_verify: int = 16  # spec.max_verify_tokens
    name: str = ""  # scheduler name in stats (defaults to the policy's)

    def __post_init__(self) -> None:
        self.name = self.name or self.policy.name

    def gamma(self, slot: int, default: int) -> int:
        return min(default, self.regulator.gamma_for(slot))

    def choose(self, requests: list[DraftRequest], proposal: Proposal) -> list[int]:
        nums = [min(n, self.max_verify) for n in proposal.num]
        if proposal.confidence is None:  # a drafter without a confidence head: nothing to rank
            return nums
        conf = proposal.confidence.detach().float().cpu().tolist()
        rows = [row[:n] for row, n in zip(conf, nums, strict=True)]
        return self.policy.schedule(rows)

    def observe(self, results: list[RoundResult]) -> None:
        for res in results:
            if res.finished:
                self.regulator.drop(res.slot)
            else:
                self.regulator.observe(res.slot, res.verified, res.accepted)


def profile_target_sps(target: LeanModel, max_batch_tokens: int, *, context: int = 64, repeats: int = 3
                       ) -> SpsTable:
    """Steps per second of one target forward over B new tokens (B = default_probes up to the max).

    The B tokens run as one row after a `context`-token prefix in a scratch cache, which is what the cost
    of a verify batch depends on first (total tokens); the cache is thrown away afterwards.
    """
    import torch

    cache = target.new_cache(1, context + max_batch_tokens + 1)
    prefix = torch.randint(1, target.arch.vocab_size, (1, context))
    target(prefix, cache, [0])

    def step(b: int) -> None:
        target(torch.randint(1, target.arch.vocab_size, (1, b)), cache, [0])
        cache.truncate(0, context)
        if target.device.type == "cuda":
            torch.cuda.synchronize()

    return profile_sps(step, default_probes(max_batch_tokens), warmup=1, repeats=repeats,
                       max_batch_tokens=max_batch_tokens)


def build_verify_scheduler(config: EngineConfig, target: LeanModel, sps: SpsTable | None = None
                           ) -> EngineScheduler:
    """The engine's scheduler for `config.spec` (entry point used by engine.build_scheduler)."""
    spec = config.spec
    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=spec.block_size, adaptive=False,
                                         fallback_floor=spec.fallback_acceptance))
    if sps is None and spec.scheduler in ("prefix", "async_topk"):
        max_tokens = config.batch.max_requests * (min(spec.block_size, spec.max_verify_tokens) + 1)
        sps = SpsTable.load(spec.sps_path) if spec.sps_path else profile_target_sps(target, max_tokens)
    policy = make_scheduler(spec.scheduler, sps=sps, threshold=spec.confidence_threshold)
    return EngineScheduler(policy=policy, regulator=reg, max_verify=spec.max_verify_tokens)
