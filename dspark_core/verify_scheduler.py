"""Engine side of the schedulers: the `VerifyScheduler` the round loop calls (drafters/base.py).

It ties together, per round: the gamma regulator and fallback (how many tokens each request drafts,
regulator.py), a verification-length policy (schedulers.py) fed with the drafter's calibrated
confidences, and the SPS table (sps.py) that the prefix / async_topk policies need: loaded from
`spec.sps_path` when given, else profiled on the target when the engine starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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
    learn_overhead: bool = True  # estimate the per-round cost beyond the target step online
    ema: float = 0.2  # weight of the newest round in the overhead estimate
    _last: tuple[float, int] | None = field(default=None, repr=False)  # (time of last decision, its batch)

    def __post_init__(self) -> None:
        self.name = self.name or self.policy.name

    def _observe_round_time(self, now: float) -> None:
        """Round time between two decisions = target step at the last batch + everything else (drafting,
        bookkeeping); the 'everything else' part becomes the policy's per-round overhead (EMA)."""
        sps = getattr(self.policy, "sps", None)
        if self._last is None or sps is None or not self.learn_overhead:
            return
        t0, batch = self._last
        if now - t0 > 1.0:  # an idle gap (between generate calls), not a round
            return
        extra = max(0.0, (now - t0) - 1.0 / sps.lookup(batch))
        old = float(getattr(self.policy, "overhead_s", 0.0))
        self.policy.overhead_s = extra if old == 0.0 else (1 - self.ema) * old + self.ema * extra  # type: ignore[attr-defined]

    def gamma(self, slot: int, default: int) -> int:
        return min(default, self.regulator.gamma_for(slot))

    def choose(self, requests: list[DraftRequest], proposal: Proposal) -> list[int]:
        nums = [min(n, self.max_verify) for n in proposal.num]
        if proposal.confidence is None:  # a drafter without a confidence head: nothing to rank
            return nums
        conf = proposal.confidence.detach().float().cpu().tolist()
        rows = [row[:n] for row, n in zip(conf, nums, strict=True)]
        self._observe_round_time(time.perf_counter())
        lengths = self.policy.schedule(rows)
        padded = bool(getattr(self.policy, "padded", False))
        batch = len(rows) * (max(lengths, default=0) + 1) if padded else sum(lengths) + len(rows)
        self._last = (time.perf_counter(), batch)
        return lengths

    def observe(self, results: list[RoundResult]) -> None:
        for res in results:
            if res.finished:
                self.regulator.drop(res.slot)
            else:
                self.regulator.observe(res.slot, res.verified, res.accepted)


def profile_target_sps(target: LeanModel, max_batch_tokens: int, *, rows: int = 1, context: int = 64,
                       repeats: int = 3) -> SpsTable:
    """Steps per second of one target forward over B verify tokens, in the round loop's shape.

    B = rows * t: `rows` requests (slots with a `context`-token history each) append t tokens, t = 1, 2, ...
    up to max_batch_tokens / rows (for rows = 1, the default probe ladder). Verify cost on a padded engine
    depends on the row count as much as on the tokens, so the engine profiles with its batch size. The
    scratch cache is thrown away afterwards.
    """
    import torch

    rows = max(1, min(rows, max_batch_tokens))
    longest = max(1, max_batch_tokens // rows)
    cache = target.new_cache(rows, context + longest + 1)
    for r in range(rows):
        target(torch.randint(1, target.arch.vocab_size, (1, context)), cache, [r])

    def step(b: int) -> None:
        t = max(1, b // rows)
        target(torch.randint(1, target.arch.vocab_size, (rows, t)), cache, list(range(rows)))
        for r in range(rows):
            cache.truncate(r, context)
        if target.device.type == "cuda":
            torch.cuda.synchronize()

    probes = default_probes(max_batch_tokens) if rows == 1 else [rows * t for t in range(1, longest + 1)]
    return profile_sps(step, probes, warmup=1, repeats=repeats, max_batch_tokens=max_batch_tokens)


def build_verify_scheduler(config: EngineConfig, target: LeanModel, sps: SpsTable | None = None
                           ) -> EngineScheduler:
    """The engine's scheduler for `config.spec` (entry point used by engine.build_scheduler)."""
    spec = config.spec
    reg = GammaRegulator(RegulatorConfig(gamma_min=1, gamma_max=spec.block_size, adaptive=False,
                                         fallback_floor=spec.fallback_acceptance))
    if sps is None and spec.scheduler in ("prefix", "async_topk"):
        max_tokens = config.batch.max_requests * (min(spec.block_size, spec.max_verify_tokens) + 1)
        sps = SpsTable.load(spec.sps_path) if spec.sps_path else \
            profile_target_sps(target, max_tokens, rows=config.batch.max_requests)
    policy = make_scheduler(spec.scheduler, sps=sps, threshold=spec.confidence_threshold)
    if hasattr(policy, "padded"):
        policy.padded = True  # type: ignore[attr-defined]  # the round loop pads every row to the longest
    return EngineScheduler(policy=policy, regulator=reg, max_verify=spec.max_verify_tokens)
