"""Acceptance model for the simulator: per-position conditional acceptance and confidences.

Source, in order: the profile's measured `accept.*` (a real drafter on this workload), else a
published prior (tuner/catalog/acceptance_priors.yaml when present, else the DSpark paper's
headline figures quoted in DESIGN.md section 4).

Prior shape. How acceptance falls with position comes from the paper's Figure 4 (tau against draft
length 4/8/12/16 per domain and head, Qwen3-4B): a geometric alpha_k = a * d**(k-1) fitted to those four
points (least squares on tau), then scaled so tau at gamma = 7 equals the target's Table 1 figure. Depth
comes from Figure 3 (tau with 1, 2 and 5 draft layers at gamma = 7): tau at gamma = 7 is multiplied by
tau(layers) / tau(5 layers), linear between the plotted depths and held at 1 beyond 5 (not measured).
Without the catalogue the curve is alpha_k = a * d**(k-1) with `a` solved for tau at the reference
block length (d from the geometric fit of Figure 2).

Confidences: each drafted token has a latent survival probability p ~ Beta(kappa*alpha_k,
kappa*(1-alpha_k)); the token is accepted with probability p and the (calibrated) confidence head
reports p. This gives the schedulers the signal the paper's calibrated head gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
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
    table: tuple[float, ...] = ()  # per-position conditional acceptance (overrides first; decay continues it)

    def alphas(self, gamma: int) -> list[float]:
        if self.table:
            t = list(self.table)
            return [min(0.999, t[k] if k < len(t) else t[-1] * self.decay ** (k - len(t) + 1)) for k in range(gamma)]
        return [min(0.999, self.first * self.decay**k) for k in range(gamma)]

    def tau(self, gamma: int) -> float:
        return expected_tau(self.alphas(gamma))

    def draw(self, rng: np.random.Generator, requests: int, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [R, gamma] and acceptance outcomes [R, gamma] (bool) for one round (the simulator's inner
        loop: the Beta parameters are computed once per block length)."""
        a, b = _beta_params(self, gamma)  # [gamma] each
        p = rng.beta(a, b, size=(requests, gamma))
        return p, rng.random(p.shape) < p


@lru_cache(maxsize=256)
def _beta_params(model: AcceptanceModel, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """The Beta distribution's (a, b) per position: kappa x alpha and kappa x (1 - alpha), alpha clipped."""
    alpha = np.clip(np.array(model.alphas(gamma)), 1e-3, 0.999)
    return model.kappa * alpha, model.kappa * (1 - alpha)


@lru_cache(maxsize=1)
def _priors() -> dict:
    return (yaml.safe_load(PRIORS_FILE.read_text()) or {}) if PRIORS_FILE.exists() else {}


FIG4_KEY = {"none": "dflash", "markov": "dspark_markov", "rnn": "dspark_rnn"}  # head -> Figure 4 series
DOMAINS = ("math", "code", "chat")


@lru_cache(maxsize=64)
def fit_geometric(gammas: tuple[int, ...], taus: tuple[float, ...]) -> tuple[float, float]:
    """(a, d) of alpha_k = a * d**(k-1) minimising the squared tau error at the given gammas (grid search)."""
    a = np.linspace(0.30, 0.999, 700)[:, None, None]
    d = np.linspace(0.80, 1.02, 221)[None, :, None]
    k = np.arange(max(gammas))[None, None, :]
    surv = np.cumprod(np.minimum(0.999, a * d**k), axis=-1)  # [A, D, K]
    tau = 1.0 + np.cumsum(surv, axis=-1)
    err = sum((tau[..., g - 1] - t) ** 2 for g, t in zip(gammas, taus, strict=True))
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    return float(a[i, 0, 0]), float(d[0, j, 0])


def _fig4(domain: str, head: str) -> tuple[list[int], list[float]] | None:
    """Figure 4's tau at gamma 3/7/11/15 for the head on the domain (mixed: mean of the three domains)."""
    fig = _priors().get("tau_vs_gamma") or {}
    key = FIG4_KEY.get(head, "dspark_markov")
    doms = [domain] if domain in fig else [d for d in DOMAINS if d in fig]
    rows = [fig[d][key] for d in doms if key in fig.get(d, {})]
    if not rows or "gamma" not in fig:
        return None
    return list(fig["gamma"]), [float(np.mean(col)) for col in zip(*rows, strict=True)]


def depth_ratio(domain: str, layers: int | None) -> float:
    """tau(layers) / tau(5 layers) at gamma = 7 from Figure 3 (DSpark, Qwen3-4B); 1 when unknown or > 5."""
    fig = _priors().get("depth") or {}
    if layers is None or layers >= 5 or "dspark_5_layer" not in fig:
        return 1.0
    names = _priors().get("domain_map") or {}
    # Figure 3 labels Arena-Hard v2 ("arena_hard_v2"); Table 1 and the domain map say "arena_hard"
    cols = {d: [i for i, c in enumerate(fig["columns"]) if c.removesuffix("_v2") in names.get(d, [])]
            for d in DOMAINS}
    idx = cols.get(domain) or [i for d in DOMAINS for i in cols[d]]
    depth = {n: float(np.mean([fig[f"dspark_{n}_layer"][i] for i in idx])) for n in (1, 2, 5)}
    return float(np.interp(max(1, layers), [1, 2, 5], [depth[1], depth[2], depth[5]])) / depth[5]


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


def _scaled(alphas: list[float], tau: float, gamma: int = REF_GAMMA) -> tuple[float, ...]:
    """The curve times the constant that makes its tau at `gamma` equal `tau`."""
    lo, hi = 0.0, 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tau([min(0.999, mid * a) for a in alphas[:gamma]]) < tau else (lo, mid)
    return tuple(min(0.999, (lo + hi) / 2 * a) for a in alphas)


def _prior_model(domain: str, head: str, kappa: float, draft_layers: int | None) -> AcceptanceModel:
    tau, src = _prior_tau(domain, head)
    ratio = depth_ratio(domain, draft_layers)
    if ratio != 1.0:
        tau, src = tau * ratio, f"{src}; x{ratio:.3f} for {draft_layers} draft layers (paper Fig. 3)"
    fig = _fig4(domain, head)
    if fig is None:
        decay = _decay(domain, head)
        return AcceptanceModel(_solve_first(tau, decay, REF_GAMMA), decay, kappa, src)
    gammas, taus = fig
    if head == "rnn":  # Table 1 has the Markov head only: carry Figure 4's RNN / Markov ratio at gamma 7
        markov = _fig4(domain, "markov")
        if markov is not None:
            tau *= float(np.interp(REF_GAMMA, gammas, taus)) / float(np.interp(REF_GAMMA, *markov))
    a, d = fit_geometric(tuple(gammas), tuple(taus))
    table = _scaled([a * d**k for k in range(16)], tau)
    return AcceptanceModel(table[0], d, kappa, f"{src}; decay over positions: paper Fig. 4 (d = {d:.3f})", table)


def _measured_decay(pa: list[float], default: float) -> float:
    """Geometric decay from the first to the last measured position (clipped to [0.5, 1]); `default` without two."""
    if len(pa) > 1 and pa[0] > 0:
        return float(np.clip((pa[-1] / pa[0]) ** (1 / (len(pa) - 1)), 0.5, 1.0))
    return default


def acceptance_for(profile: Profile, head: str, kappa: float = 3.0, draft_layers: int | None = None
                   ) -> AcceptanceModel:
    """The acceptance model for a head on this profile's workload: measured if the profile has it.

    `draft_layers` scales a published prior by the paper's depth curve; a measured profile belongs to
    one drafter, whose depth it already reflects."""
    acc = profile.accept
    domain = profile.workload.domain or "mixed"
    decay = _decay(domain, head)
    if acc.per_head and acc.per_head.get(head):  # this head's drafter was measured: its per-position figures
        pa = list(acc.per_head[head])
        return AcceptanceModel(pa[0], _measured_decay(pa, decay), kappa,
                               f"measured ({head}): {acc.source or 'profile accept.per_head'}", table=tuple(pa))
    if acc.position_acceptance:
        pa = list(acc.position_acceptance)
        decay = _measured_decay(pa, decay)
        measured_head = (acc.drafter or "").split("_")[-1] if acc.drafter else head
        if measured_head != head and head == "none":
            decay = min(decay, DECAY["none"])
        return AcceptanceModel(pa[0], decay, kappa, f"measured: {acc.source or acc.drafter or 'profile accept.*'}")
    if acc.tau and acc.gamma:
        return AcceptanceModel(_solve_first(acc.tau, decay, acc.gamma), decay, kappa,
                               f"measured: tau {acc.tau} at gamma {acc.gamma}")
    return _prior_model(domain, head, kappa, draft_layers)


def with_tau(model: AcceptanceModel, tau: float, steps: int, source: str) -> AcceptanceModel:
    """`model`'s per-position shape rescaled so that its tau at `steps` draft tokens is `tau` (estimate --tau)."""
    if steps <= 0:
        return model
    tau = min(max(1.0, tau), steps + 1.0)
    base = model.alphas(max(steps, 16))
    table = _scaled(base, tau, steps)
    return AcceptanceModel(table[0], model.decay, model.kappa, source, table)


def method_prior(method: str, domain: str, kappa: float = 3.0) -> AcceptanceModel:
    """The published prior of a method beyond DSpark / DFlash (acceptance_priors.yaml `method_priors`)."""
    rows = _priors().get("method_priors") or {}
    row = rows.get(method) or rows["eagle3"]
    if row.get("same_as"):
        base = method_prior(row["same_as"], domain, kappa)
        return AcceptanceModel(base.first, base.decay, kappa, f"prior: {row['source']}", base.table)
    src = f"prior: {row['source']}"
    if "per_position" in row:  # EAGLE-3: the paper's curve on the domain, scaled to its Table 1 tau at 7
        curves = row["per_position"]
        pa = curves.get(domain) or [float(np.mean(c)) for c in zip(*curves.values(), strict=True)]
        tau = float((row.get("per_domain_tau_at_7") or {}).get(domain, expected_tau(pa)))
        table = _scaled(list(pa) + [pa[-1]] * 9, tau, REF_GAMMA)
        return AcceptanceModel(table[0], 1.0, kappa, src, table)
    if "tau_by_steps" in row:  # MTP: conditional acceptance solved from consecutive acceptance lengths
        taus = row["tau_by_steps"]
        steps = sorted(int(k) for k in taus)
        table, surv, prev = [], 1.0, 1.0
        for k in steps:
            gain = max(1e-3, float(taus[k]) - prev)
            table.append(min(0.999, gain / surv))
            surv, prev = gain, float(taus[k])
        return AcceptanceModel(table[0], min(1.0, table[-1] / max(1e-3, table[-2])) if len(table) > 1 else 0.9,
                               kappa, src, tuple(table))
    at = row["tau_at"]
    decay = float(row.get("decay", 0.9))
    return AcceptanceModel(_solve_first(float(at["tau"]), decay, int(at["steps"])), decay, kappa, src)


def acceptance_of(profile: Profile, method: str, head: str = "markov", draft_layers: int | None = None,
                  kappa: float = 3.0) -> AcceptanceModel:
    """The acceptance model of the method a deployment runs: DSpark / DFlash through `acceptance_for`; the others
    from the profile's accept_methods (this target's bench of the method), else its accept.* when it belongs to that
    method's drafter (a catalogued or measured figure), else their published prior."""
    if method in ("dspark", "dflash"):
        return acceptance_for(profile, head if method == "dspark" else "none", kappa, draft_layers)
    measured = (getattr(profile, "accept_methods", None) or {}).get(method)
    if measured is not None and measured.position_acceptance:  # this target's bench of the method (its domain)
        pa = list(measured.position_acceptance)
        return AcceptanceModel(pa[0], _measured_decay(pa, 1.0), kappa, f"{measured.source}", table=tuple(pa))
    acc = profile.accept
    drafter = getattr(profile, "drafter", None)
    mine = drafter is not None and getattr(drafter, "method", None) == method
    if mine and acc.position_acceptance:
        pa = list(acc.position_acceptance)
        return AcceptanceModel(pa[0], _measured_decay(pa, 1.0), kappa,
                               f"{acc.source or 'profile accept.*'}", table=tuple(pa))
    if mine and acc.tau and acc.gamma:
        base = method_prior(method, profile.workload.domain or "mixed", kappa)
        return with_tau(base, acc.tau, acc.gamma, f"{acc.source or 'profile accept.*'}: tau {acc.tau} at {acc.gamma}")
    return method_prior(method, profile.workload.domain or "mixed", kappa)
