"""Online batching decisions of `serve`: the batching timeout, the engine-wide block length, and admission
under an SLO, from the observed arrival rate, the measured acceptance and the SPS table.

- Timeout (`batch.timeout_ms` is its bound). An idle engine waits for more arrivals before prefilling only
  when the predicted gap to the next arrival (1 / the decayed arrival rate) is shorter than the bound: then a
  few more requests join the prefill; at a sparse rate waiting only adds latency, so it does not wait.
  Static (`adaptive=False`) always waits the bound while the batch is not full.
- Block length. With B running requests and per-position acceptance a_1, a_2, ... (decayed counts of the
  engine's rounds), drafting g tokens commits B * tau(g) * SPS(B * (g + 1)) tokens per second, tau(g) =
  1 + sum_k prod_{i<=k} a_i. Each step runs the g in [0, spec.block_size] that maximises it (5% hysteresis):
  long blocks while the verify batch is nearly free, shorter ones as load fills it, plain decoding (g = 0)
  engine-wide once verification no longer pays. After 32 plain steps one step drafts again, so the acceptance
  estimate recovers when the traffic changes. Static always drafts the full block.
- Admission cap. With a TPOT SLO, at most the largest batch whose predicted time per output token, 1 / (tau(g) *
  SPS(B * (g + 1))) at that batch's best g, meets the SLO runs at once; without one, every slot (the tuned
  `batch.max_requests` is the bound either way).
- Admission. With a TTFT SLO, a request whose predicted TTFT (queued requests ahead of it over the slots, times
  the decayed mean request duration) exceeds it gets 429 at once instead of a late first token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dspark_core.verification.sps import SpsTable

HYSTERESIS = 0.05  # the block length changes only for a 5% better token rate


@dataclass
class Decision:
    """What the driver applies before the next step."""

    wait_s: float  # how long an idle engine waits for more arrivals before it prefills
    gamma: int  # the engine-wide block length cap (0: plain decoding)
    cap: int | None = None  # the most requests that may run at once (None: every slot)


class Batcher:
    """Decayed estimates of the arrival rate, acceptance and request duration, and the decisions they imply."""

    def __init__(self, slots: int, timeout_s: float, gamma: int, sps: SpsTable | None, adaptive: bool = True,
                 ttft_slo_s: float | None = None, time_constant_s: float = 2.0,
                 tpot_slo_s: float | None = None) -> None:
        self.slots, self.timeout_s, self.block, self.sps = slots, timeout_s, gamma, sps
        self.adaptive, self.ttft_slo_s, self.tc, self.tpot_slo_s = adaptive, ttft_slo_s, time_constant_s, tpot_slo_s
        self._arrivals, self._t_arrival = 0.0, None  # decayed arrival count, time of the last arrival
        self.accepts = [0.0] * gamma  # decayed accepted drafts per position
        self.attempts = [0.0] * gamma  # decayed verified drafts per position (earlier ones accepted)
        self.duration_s: float | None = None  # decayed mean decode duration of a request
        self.gamma = gamma  # the block length of the last decision
        self.switches = 0  # block length changes so far
        self._plain_steps = 0
        self._cap: int | None = None  # the last admission cap and the steps since it was computed
        self._cap_age = 0

    def arrival(self, t: float) -> None:
        if self._t_arrival is not None:
            self._arrivals *= math.exp(-(t - self._t_arrival) / self.tc)
        self._arrivals, self._t_arrival = self._arrivals + 1.0, t

    def rate(self, t: float) -> float:
        """Arrivals per second, decayed to `t`."""
        if self._t_arrival is None:
            return 0.0
        return self._arrivals * math.exp(-(t - self._t_arrival) / self.tc) / self.tc

    def rounds(self, accepts: list[int], attempts: list[int]) -> None:
        """Per-position accepted and verified drafts of the last step (about 256 verified drafts of memory)."""
        if not attempts or not attempts[0]:
            return
        keep = max(0.0, 1.0 - attempts[0] / 256.0)
        for k in range(self.block):
            self.accepts[k] = keep * self.accepts[k] + (accepts[k] if k < len(accepts) else 0)
            self.attempts[k] = keep * self.attempts[k] + (attempts[k] if k < len(attempts) else 0)

    def alphas(self) -> list[float]:
        """Estimated conditional acceptance per position (a position never tried takes the one before it)."""
        out, prev = [], 0.5
        for acc, att in zip(self.accepts, self.attempts, strict=True):
            prev = (acc + prev) / (att + 1.0) if att > 0 else prev  # one pseudo-count at the previous estimate
            out.append(prev)
        return out

    def finished(self, duration_s: float) -> None:
        self.duration_s = duration_s if self.duration_s is None else self.duration_s + 0.1 * (
            duration_s - self.duration_s)

    def decide(self, t: float, running: int, waiting: int) -> Decision:
        wait = 0.0
        if running == 0 and 0 < waiting < self.slots and self.timeout_s > 0:
            if not self.adaptive:
                wait = self.timeout_s
            else:
                r = self.rate(t)
                gap = 1.0 / r if r > 0 else math.inf
                wait = min(self.timeout_s, 2.0 * gap) if gap < self.timeout_s else 0.0
        return Decision(wait, self._gamma(max(1, running + min(waiting, self.slots - running))), self.cap())

    def tpot_s(self, batch: int) -> float:
        """Predicted time per output token of `batch` running requests at that batch's best block length."""
        assert self.sps is not None
        g = max(range(self.block + 1), key=lambda k: self.rate_at(k, batch))
        return batch / self.rate_at(g, batch)

    def cap(self) -> int | None:
        """The largest batch meeting the TPOT SLO (at least 1); None without an SLO, an SPS table or adaptivity.
        Recomputed every 16 steps (the acceptance it reads moves slowly)."""
        if not self.adaptive or self.tpot_slo_s is None or self.sps is None:
            return None
        self._cap_age += 1
        if self._cap is None or self._cap_age >= 16:
            ok = [b for b in range(1, self.slots + 1) if self.tpot_s(b) <= self.tpot_slo_s]
            self._cap, self._cap_age = (max(ok) if ok else 1), 0
        return self._cap

    def rate_at(self, gamma: int, batch: int) -> float:
        """Committed tokens per second of a step of `batch` requests drafting `gamma` tokens each."""
        assert self.sps is not None
        tau, surv = 1.0, 1.0
        for a in self.alphas()[:gamma]:
            surv *= a
            tau += surv
        return batch * tau * self.sps(batch * (gamma + 1))

    def _gamma(self, batch: int) -> int:
        if not self.adaptive or self.sps is None or not self.block:
            return self.block
        if self.gamma == 0:
            self._plain_steps += 1
            if self._plain_steps >= 32:  # probe: one drafting step refreshes the acceptance estimate
                self._plain_steps = 0
                return max(1, self.block // 2)
        best = max(range(self.block + 1), key=lambda g: self.rate_at(g, batch))
        if best != self.gamma and self.rate_at(best, batch) > self.rate_at(self.gamma, batch) * (1.0 + HYSTERESIS):
            self.gamma, self.switches = best, self.switches + 1
            self._plain_steps = 0
        return self.gamma

    def predicted_ttft_s(self, waiting: int) -> float | None:
        """Predicted TTFT of a request that joins the queue behind `waiting` others."""
        if self.duration_s is None:
            return None
        return (waiting // self.slots) * self.duration_s

    def admit(self, waiting: int) -> tuple[bool, float | None]:
        """(admit?, predicted TTFT) for a new request; always True without an SLO or while static."""
        ttft = self.predicted_ttft_s(waiting)
        ok = not (self.adaptive and self.ttft_slo_s is not None and ttft is not None and ttft > self.ttft_slo_s)
        return ok, ttft
