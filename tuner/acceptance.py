"""Acceptance model for the simulator: per-position conditional acceptance and confidences.

Source, in order: the profile's measured `accept.*` (a real drafter on this workload), else a
published prior (tuner/catalog/acceptance_priors.yaml when present, else the DSpark paper's
headline figures quoted in DESIGN.md section 4). The per-position curve is alpha_k = a * d**(k-1),
with `a` solved so the expected tau at the reference block length equals the source's tau and d from
the geometric fit of the paper's Figure 2 curves (nearly flat: 0.99 without a head, 0.997 with one).

Confidences: each drafted token has a latent survival probability p ~ Beta(kappa*alpha_k,
kappa*(1-alpha_k)); the token is accepted with probability p and the (calibrated) confidence head
reports p. This gives the schedulers the signal the paper's calibrated head gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from profiler.schema import Profile

PRIORS_FILE = Path(__file__).parent / "catalog" / "acceptance_priors.yaml"

# DSpark paper (Cheng et al. 2026), Qwen3-8B target, temperature 1, as quoted in DESIGN.md section 4:
# tau at the paper's default gamma = 7 (GSM8K for math, MT-Bench for chat).
HEADLINE_TAU = {
    ("math", "markov"): 6.17, ("math", "none"): 5.33,
    ("chat", "markov"): 3.72, ("chat", "none"): 3.11,
}
HEADLINE_SOURCE = "DSpark paper (Cheng et al. 2026), Qwen3-8B, T=1, gamma=7: GSM8K and MT-Bench tau"
DECAY = {"none": 0.99, "markov": 0.997, "rnn": 0.997}  # fallback decay when the priors file has no fit
REF_GAMMA = 7


def expected_tau(alphas: list[float]) -> float:
    """E[accepted tokens per round incl. the bonus] = 1 + sum_k prod_{i<=k} alpha_i."""
    tau, surv = 1.0, 1.0
    for a in alphas:
        surv *= a
        tau += surv
    return tau


def _solve_first(tau: float, decay: float, gamma: int) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        alphas = [min(1.0, mid * decay**k) for k in range(gamma)]
        lo, hi = (mid, hi) if expected_tau(alphas) < tau else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class AcceptanceModel:
    first: float  # conditional acceptance at position 1
    decay: float  # alpha_{k+1} / alpha_k
    kappa: float  # Beta concentration of the latent survival probability (higher = less spread)
    source: str  # "measured: ..." or "prior: ..."
    table: tuple[float, ...] = ()  # measured per-position conditional acceptance (overrides first/decay)

    def alphas(self, gamma: int) -> list[float]:
        if self.table:
            t = list(self.table)
            return [min(0.999, t[k] if k < len(t) else t[-1] * self.decay ** (k - len(t) + 1)) for k in range(gamma)]
        return [min(0.999, self.first * self.decay**k) for k in range(gamma)]

    def tau(self, gamma: int) -> float:
        return expected_tau(self.alphas(gamma))

    def draw(self, rng: np.random.Generator, requests: int, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [R, gamma] and acceptance outcomes [R, gamma] (bool) for one round."""
        a = np.clip(np.array(self.alphas(gamma)), 1e-3, 0.999)[None, :].repeat(requests, 0)
        p = rng.beta(self.kappa * a, self.kappa * (1 - a))
        return p, rng.random(p.shape) < p


def _priors() -> dict:
    return (yaml.safe_load(PRIORS_FILE.read_text()) or {}) if PRIORS_FILE.exists() else {}


def _decay(domain: str, head: str) -> float:
    """Per-position decay from the paper's Figure 2 curves (geometric fit, catalog), capped at 1."""
    fits = (_priors().get("position_conditional_acceptance") or {}).get("geometric_fit") or {}
    key = "dflash" if head == "none" else "dspark"
    rows = [fits[d][key]["d"] for d in ([domain] if domain in fits else list(fits)) if key in fits.get(d, {})]
    return min(1.0, float(np.mean(rows))) if rows else DECAY.get(head, DECAY["markov"])


def _prior_tau(domain: str, head: str) -> tuple[float, str]:
    base = "none" if head == "none" else "markov"
    if PRIORS_FILE.exists():
        table = _priors().get("simulator_tau") or {}
        row = table.get(domain) or table.get("mixed") or {}
        if base in row:
            return float(row[base]["tau"]), f"prior: {row[base].get('source', PRIORS_FILE.name)}"
    dom = domain if (domain, base) in HEADLINE_TAU else ("math" if domain == "code" else "chat")
    if domain == "mixed":
        tau = (HEADLINE_TAU[("math", base)] + HEADLINE_TAU[("chat", base)]) / 2
        return tau, f"prior: mean of GSM8K and MT-Bench, {HEADLINE_SOURCE}"
    note = "" if dom == domain else f" ({domain} uses the {dom} figure)"
    return HEADLINE_TAU[(dom, base)], f"prior: {HEADLINE_SOURCE}{note}"


def acceptance_for(profile: Profile, head: str, kappa: float = 3.0) -> AcceptanceModel:
    """The acceptance model for a head on this profile's workload: measured if the profile has it."""
    acc = profile.accept
    domain = profile.workload.domain or "mixed"
    decay = _decay(domain, head)
    if acc.position_acceptance:
        pa = list(acc.position_acceptance)
        first = pa[0]
        if len(pa) > 1 and pa[0] > 0:
            decay = float(np.clip((pa[-1] / pa[0]) ** (1 / (len(pa) - 1)), 0.5, 1.0))
        measured_head = (acc.drafter or "").split("_")[-1] if acc.drafter else head
        if measured_head != head and head == "none":
            decay = min(decay, DECAY["none"])
        return AcceptanceModel(first, decay, kappa, f"measured: {acc.source or acc.drafter or 'profile accept.*'}")
    if acc.tau and acc.gamma:
        return AcceptanceModel(_solve_first(acc.tau, decay, acc.gamma), decay, kappa,
                               f"measured: tau {acc.tau} at gamma {acc.gamma}")
    tau, src = _prior_tau(domain, head)
    return AcceptanceModel(_solve_first(tau, decay, REF_GAMMA), decay, kappa, src)
