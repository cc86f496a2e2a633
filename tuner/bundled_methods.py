"""What a measured study (`tune --gpu cpu`, the bundled engine on this device) searches among speculative methods.

The bundled engine runs plain decoding, n-gram, suffix decoding, DSpark and the DSpark + suffix hybrid
(dspark_core/drafters), so a measured study searches exactly those the deployment can run (kb/method_choice.py):
`spec.method` among `plain` (speculation off: `tuner.space.consistent`), the runnable bundled ones and `hybrid` where
DSpark is runnable (suffix always is: it needs no checkpoint). One knob, so the coordinate screen (tuner/design.py)
compares the methods from the same point instead of turning speculation off before it ever tries suffix. Where
suffix decoding can be drawn, its two proposal settings are searched at the values measured to matter
(benchmarks/RESULTS.md, "Suffix decoding in the engine": vLLM's defaults gave 1.93x plain on held-out code, a full
block from any match 2.67x).
"""

from __future__ import annotations

from tuner.engine_config import BUNDLED_METHODS
from tuner.space import SearchSpace

SUFFIX_SPEC_FACTORS = (1.0, 8.0)  # drafter.suffix_spec_factor: vLLM's default; a full block from a 1-token match
SUFFIX_MIN_PROBS = (0.02, 0.1)  # drafter.suffix_min_prob: the full-block config's floor; vLLM's default


def measured_space(space: SearchSpace, deploy: str | None) -> SearchSpace:
    """`space` with spec.method among what the bundled engine runs and the deploy's engines run too (tuner/deploy.py),
    plain decoding a choice, and suffix's settings searched where suffix or the hybrid can be drawn. A space whose
    method is fixed, or not set (old profiles: DSpark), keeps it."""
    from optuna.distributions import CategoricalDistribution

    from tuner.deploy import restrict

    dists, fixed, warm = dict(space.distributions), dict(space.fixed), dict(space.warm_start)
    method = dists.get("spec.method")
    if method is None:
        return restrict(space, deploy)
    choices = [m for m in method.choices if m in BUNDLED_METHODS]
    if "dspark" in choices and "suffix" in choices:
        choices.append("hybrid")
    if choices and "spec.enabled" not in fixed and "spec.enabled" not in dists:
        choices.append("plain")
    if not choices:
        return restrict(space, deploy)  # nothing here the bundled engine runs: as planned (its trials say why)
    del dists["spec.method"]
    if len(choices) == 1:
        fixed["spec.method"] = choices[0]
    else:
        dists["spec.method"] = CategoricalDistribution(choices)
    if warm.get("spec.method") not in choices:
        warm.pop("spec.method", None)
    out = restrict(SearchSpace(dists, fixed, space.defaults, warm, space.running_cap), deploy)
    left = out.distributions["spec.method"].choices if "spec.method" in out.distributions else \
        (out.fixed.get("spec.method"),)
    if {"suffix", "hybrid"} & set(left):
        out.distributions.setdefault("drafter.suffix_spec_factor", CategoricalDistribution(list(SUFFIX_SPEC_FACTORS)))
        out.distributions.setdefault("drafter.suffix_min_prob", CategoricalDistribution(list(SUFFIX_MIN_PROBS)))
    return out
