"""What a measured study (`tune --gpu cpu`, the bundled engine on this device) searches among speculative methods.

The bundled engine runs plain decoding, n-gram, suffix decoding, DSpark and the DSpark + suffix hybrid
(dspark_core/drafters), so a measured study searches exactly those the deployment can run (kb/method_choice.py):
`spec.method` among `plain` (speculation off: `tuner.space.consistent`), the runnable bundled ones and `hybrid` where
DSpark is runnable (suffix always is: it needs no checkpoint). One knob, so the coordinate screen (tuner/design.py)
compares the methods from the same point instead of turning speculation off before it ever tries suffix. Where
suffix decoding can be drawn, its two proposal settings are searched at the values measured to matter
(benchmarks/RESULTS.md, "Suffix decoding in the engine": vLLM's defaults gave 1.93x plain on held-out code, a full
block from any match 2.67x), starting from the full block, so the screen compares suffix and the hybrid with the
other methods at their measured settings. The screen moves a drafter's knob only from a point whose method reads it
(`SearchSpace.reads`): an n-gram point run again with another suffix setting measures nothing new.
"""

from __future__ import annotations

from dspark_core.config import GAMMA_POLICY_METHODS
from kb.match import FixedEntry, Plan
from tuner.engine_config import BUNDLED_METHODS
from tuner.space import SearchSpace

SUFFIX_SPEC_FACTORS = (1.0, 8.0)  # drafter.suffix_spec_factor: vLLM's default; a full block from a 1-token match
SUFFIX_MIN_PROBS = (0.02, 0.1)  # drafter.suffix_min_prob: the full-block config's floor; vLLM's default
FULL_BLOCK = {"drafter.suffix_spec_factor": 8.0, "drafter.suffix_min_prob": 0.02}  # where the screen starts them: the
# bundled engine measured it faster on code (2.67x plain against 1.93x) and level on chat (1.20x against 1.19x)
POOR_TAU = "spec.gamma.measured-poor"  # the rule that shortens blocks on the profiled DSpark drafter's tau
SUFFIX_CORPORA = ("auto", "none")  # drafter.suffix_corpus: the target's committed corpus (where it has one), or cold
DRAFTING = tuple(m for m in BUNDLED_METHODS if m != "plain")  # the methods that draft, verify and so read a block
READS = {"drafter.suffix_spec_factor": ("suffix", "hybrid"), "drafter.suffix_min_prob": ("suffix", "hybrid"),
         "drafter.suffix_corpus": ("suffix", "hybrid"), "spec.head": ("dspark", "hybrid"),
         "spec.block_size": DRAFTING, "spec.scheduler": DRAFTING,
         "spec.gamma_policy": GAMMA_POLICY_METHODS}
# the methods whose drafter reads each knob: moving it elsewhere is inert (a study that starts at plain screened
# three blocks there before it moved the method: RESULTS.md, "Suffix decoding from a frozen corpus"; the learned
# block length is the DSpark drafter's alone: dspark_core/config.learned_gamma)


def measured_space(space: SearchSpace, deploy: str | None, plan: Plan | None = None,
                   drafter_block: int | None = None, corpus: bool = False) -> SearchSpace:
    """`space` with spec.method among what the bundled engine runs and the deploy's engines run too (tuner/deploy.py),
    plain decoding a choice, and suffix's settings searched where suffix or the hybrid can be drawn. A space whose
    method is fixed, or not set (old profiles: DSpark), keeps it. Where several methods are searched, the block is
    searched up to the drafter's own (`drafter_block`) past the cut of `POOR_TAU`, a rule that reads the profiled
    DSpark drafter's tau alone (`plan`: where to see it). With `corpus` (the target has a committed suffix corpus),
    suffix decoding with and without it is searched too, from with it (the engine's default): it paid on chat and
    for suffix on code, and cost the hybrid a little on code (benchmarks/RESULTS.md, "Suffix decoding from a frozen
    corpus of the target's outputs")."""
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
        for name, v in FULL_BLOCK.items():
            if v in out.distributions[name].choices:
                out.warm_start.setdefault(name, v)
        if corpus:
            out.distributions.setdefault("drafter.suffix_corpus", CategoricalDistribution(list(SUFFIX_CORPORA)))
            out.warm_start.setdefault("drafter.suffix_corpus", SUFFIX_CORPORA[0])
    if plan is not None and drafter_block and "spec.method" in out.distributions:
        _block_past_poor_tau(out, plan, drafter_block)
    out.reads = {k: v for k, v in READS.items() if k in out.distributions and "spec.method" in out.distributions}
    return out


def has_corpus(model_path: str) -> bool:
    """Whether the target at `model_path` has a suffix corpus committed beside it (what `auto` loads)."""
    from dspark_core.config import committed_file
    from dspark_core.drafters.suffix_corpus import FILE

    return committed_file("auto", model_path, FILE) is not None


def _block_past_poor_tau(space: SearchSpace, plan: Plan, drafter_block: int) -> None:
    """Search spec.block_size from its planned low end up to `drafter_block` where `POOR_TAU` cut it below that: the
    rule shortens blocks because the profiled DSpark drafter accepts little, which says nothing of n-gram's or
    suffix's drafts (tau ~3 on code where DSpark's is ~2: RESULTS.md, issue 42), and the bundled engine measures each
    block. The planned value (or low end) stays the start, and the value of trials stored without one. In place."""
    from optuna.distributions import IntDistribution

    planned = plan.fixed.get("spec.block_size") or plan.space.get("spec.block_size")  # in space.fixed / distributions
    if planned is None or POOR_TAU not in planned.rules:
        return
    low, high = (planned.value, planned.value) if isinstance(planned, FixedEntry) else (planned.low, planned.high)
    if low is None or high is None or drafter_block <= int(high):  # a list of choices, or nothing cut
        return
    low = int(low)
    start = space.fixed.pop("spec.block_size", space.warm_start.get("spec.block_size", low))
    space.distributions["spec.block_size"] = IntDistribution(low, drafter_block)
    space.warm_start["spec.block_size"] = start
    space.defaults["spec.block_size"] = start  # a trial stored before the block was searched ran the planned one
