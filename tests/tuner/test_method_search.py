"""spec.method is searched among the methods the deployment has drafters for (kb/method_choice.py), the simulator
prices the chosen one with its own acceptance, and a model without a DSpark drafter deploys a method it can run."""

from __future__ import annotations

from typing import Any

import pytest

from kb.match import match_profile
from profiler.schema import Profile
from tests.tuner.fixtures import QWEN3_8B_H100
from tuner.space import engine_defaults

AVAILABLE = ["dspark", "eagle3", "dflash", "ngram", "suffix", "none"]
DSPARK = {"id": "deepseek-ai/dspark_qwen3_8b_block7", "method": "dspark", "heads": ["markov"], "layers": 5,
          "block_size": 7, "checkpoint": "deepseek-ai/dspark_qwen3_8b_block7", "available": AVAILABLE}


def _profile(**drafter: Any) -> Profile:
    return Profile.model_validate({**QWEN3_8B_H100, "drafter": drafter})


def test_the_plan_searches_what_the_deployment_can_run_preferring_its_drafter():
    plan = match_profile([], _profile(**DSPARK))
    entry = plan.space["spec.method"]
    assert set(entry.choices) == {"dspark", "eagle3", "dflash", "ngram", "suffix"}  # "none": spec.enabled's business
    assert plan.prefer["spec.method"].value == "dspark"
    assert any("drafter.available" in r for r in plan.resolutions)


def test_never_dspark_without_a_dspark_checkpoint():
    plan = match_profile([], _profile(available=AVAILABLE))  # published elsewhere, but no checkpoint chosen here
    assert "dspark" not in plan.space["spec.method"].choices
    only_host = match_profile([], _profile(available=["ngram", "suffix", "none"]))
    assert set(only_host.space["spec.method"].choices) == {"ngram", "suffix"}


def test_an_explicit_drafter_fixes_the_method_and_old_profiles_keep_dspark():
    plan = match_profile([], _profile(chosen="eagle3", method="eagle3", checkpoint="x/eagle3", available=AVAILABLE))
    assert plan.fixed["spec.method"].value == "eagle3" and "spec.method" not in plan.space
    for old in (_profile(), _profile(chosen="none", available=AVAILABLE)):  # no `available`; --drafter none
        plan = match_profile([], old)
        assert "spec.method" not in plan.space and "spec.method" not in plan.fixed  # default: dspark


def test_a_committed_drafter_outside_the_catalogue_is_runnable():
    plan = match_profile([], _profile(**{**DSPARK, "available": ["ngram", "suffix", "none"]}))
    assert "dspark" in plan.space["spec.method"].choices and plan.prefer["spec.method"].value == "dspark"


@pytest.fixture(scope="module")
def evaluator():
    from tuner.objective import SimulateEvaluator

    return SimulateEvaluator(_profile(**DSPARK), n_requests=24, repeats=1)


def _params(**kw: Any) -> dict[str, Any]:
    return {**engine_defaults(), "spec.block_size": 4, "batch.max_requests": 16, "batch.max_tokens": 4096,
            "spec.head": "markov", "spec.draft_layers": 5, **kw}


def test_the_simulator_prices_the_chosen_method_with_its_own_acceptance(evaluator):
    from tuner.acceptance import acceptance_of

    got = {m: evaluator.evaluate(_params(**{"spec.method": m})) for m in ("dspark", "eagle3", "ngram")}
    assert all(e.feasible for e in got.values())
    taus = {m: e.metrics["tau"] for m, e in got.items()}
    assert len({round(t, 3) for t in taus.values()}) == 3  # three methods, three acceptances
    for m in ("eagle3", "ngram"):  # the drawn tau follows the method's own model (24 requests: within 15%)
        want = acceptance_of(evaluator.profile, m).tau(4)
        assert abs(taus[m] - want) / want < 0.15, (m, taus[m], want)
    assert len({round(e.metrics["throughput"]) for e in got.values()}) == 3


def test_mtp_needs_the_module_in_the_target(evaluator):
    e = evaluator.evaluate(_params(**{"spec.method": "mtp"}))
    assert not e.feasible and "MTP" in e.why


def test_a_measured_study_searches_what_the_bundled_engine_runs():
    """plain (speculation off), n-gram, suffix, DSpark and the hybrid, as one knob; never a method only SGLang / vLLM
    run; and suffix's two settings where suffix can be drawn."""
    from tuner.study import StudySpec

    prof = _profile(**DSPARK)
    plan = match_profile([], prof)
    spec = StudySpec(profile=prof.model_dump(mode="json"), plan=plan.model_dump(mode="json"), mode="measure",
                     deploy="dspark")
    space = spec.space()
    assert set(space.distributions["spec.method"].choices) == {"dspark", "ngram", "suffix", "hybrid", "plain"}
    assert space.params_of({"spec.method": "plain"})["spec.enabled"] is False  # plain: speculation off
    assert {"drafter.suffix_spec_factor", "drafter.suffix_min_prob"} <= set(space.distributions)
    both = StudySpec(profile=prof.model_dump(mode="json"), plan=plan.model_dump(mode="json"), mode="measure",
                     deploy="both").space()  # what SGLang and vLLM also run: no suffix (SGLang), no hybrid
    assert set(both.distributions["spec.method"].choices) == {"dspark", "ngram", "plain"}
    simulated = StudySpec(profile=prof.model_dump(mode="json"), plan=plan.model_dump(mode="json")).space()
    assert "hybrid" not in simulated.distributions["spec.method"].choices  # the simulator does not price it


def test_a_measured_study_compares_the_methods_at_their_measured_settings_and_blocks():
    """Suffix and the hybrid start at the full block (measured faster on code), their knobs move only from a point that
    drafts with them, and a block the DSpark drafter's low tau alone cut short is searched up to the drafter's block."""
    from kb.match import FixedEntry, SpaceEntry
    from tuner.design import start_point
    from tuner.study import StudySpec

    prof = _profile(**DSPARK)
    plan = match_profile([], prof)
    del plan.space["spec.block_size"]  # the checkpoint's [1, 7] cut to 5, as code and a low tau cut it
    plan.fixed["spec.block_size"] = FixedEntry(value=5, rules=["drafter:x", "spec.gamma.measured-poor",
                                                                "spec.gamma.structured-domain"], why="w")
    spec = StudySpec(profile=prof.model_dump(mode="json"), plan=plan.model_dump(mode="json"), mode="measure",
                     deploy="dspark")
    space = spec.space()
    start = start_point(space)
    assert (start["drafter.suffix_spec_factor"], start["drafter.suffix_min_prob"]) == (8.0, 0.02)
    assert space.reads["drafter.suffix_spec_factor"] == ("suffix", "hybrid")
    assert "plain" not in space.reads["spec.block_size"] and "ngram" in space.reads["spec.block_size"]  # plain
    # drafts nothing: a block moved from a plain point measures it again
    assert "drafter.suffix_corpus" not in space.distributions  # DSPARK's target has no committed suffix corpus
    block = space.distributions["spec.block_size"]
    assert (block.low, block.high) == (5, 7) and start["spec.block_size"] == 5  # DSPARK's drafter drafts 7
    assert space.params_of({})["spec.block_size"] == 5  # a trial stored before the block was searched
    plan.fixed["spec.block_size"].rules = ["drafter:x", "spec.gamma.structured-domain"]  # cut by another rule: kept
    kept = spec.model_copy(update={"plan": plan.model_dump(mode="json")}).space()
    assert kept.fixed["spec.block_size"] == 5 and "spec.block_size" not in kept.distributions
    del plan.fixed["spec.block_size"]  # chat: a range [3, 5], its top end the low tau's
    plan.space["spec.block_size"] = SpaceEntry(kind="range", low=3, high=5, type="int", why="w",
                                               rules=["spec.gamma.chat-domain", "spec.gamma.measured-poor"])
    chat = spec.model_copy(update={"plan": plan.model_dump(mode="json")}).space()
    assert (chat.distributions["spec.block_size"].low, chat.distributions["spec.block_size"].high) == (3, 7)


def test_a_target_with_a_committed_suffix_corpus_searches_suffix_with_and_without_it(monkeypatch):
    """From with it (the engine's default), moved only from a point whose method drafts with suffix."""
    from pathlib import Path

    from tuner import bundled_methods
    from tuner.design import start_point
    from tuner.study import StudySpec

    tiny = Path(bundled_methods.__file__).parents[1] / "dspark_core/assets/tiny/target"
    assert bundled_methods.has_corpus("smollm2-135m") and not bundled_methods.has_corpus(str(tiny))
    monkeypatch.setattr(bundled_methods, "has_corpus", lambda path: True)  # as if DSPARK's target had one
    prof = _profile(**DSPARK)
    spec = StudySpec(profile=prof.model_dump(mode="json"), plan=match_profile([], prof).model_dump(mode="json"),
                     mode="measure", deploy="dspark")
    space = spec.space()
    assert tuple(space.distributions["drafter.suffix_corpus"].choices) == ("auto", "none")
    assert start_point(space)["drafter.suffix_corpus"] == "auto"
    assert space.reads["drafter.suffix_corpus"] == ("suffix", "hybrid")
    assert bundled_methods.READS["spec.gamma_policy"] == ("dspark",)  # the DSpark drafter's policy alone


def test_a_cpu_measured_study_defaults_to_the_bundled_engine():
    from tuner.commands_tune import default_deploy

    cpu = _profile(**DSPARK).model_copy(update={"hw": _profile().hw.model_copy(update={"arch": "cpu"})})
    assert default_deploy("measure", cpu) == "dspark"
    assert default_deploy("simulate", cpu) == "both" and default_deploy("measure", _profile()) == "both"


@pytest.mark.parametrize("model, method, algorithm", [("llama-3.1-70b", "ngram", "NGRAM"),
                                                      ("deepseek-v3", "mtp", "NEXTN")])
def test_models_without_a_dspark_drafter_deploy_what_they_can_run(model, method, algorithm):
    """Built from the real catalogue: the plan offers no DSpark, and the scripts name the engines' own method
    without asking for a drafter."""
    import json

    from profiler.build import build_profile
    from tuner.launch import SGLANG_TEMPLATE, VLLM_TEMPLATES, template_env
    from tuner.targets import sglang_context, vllm_context

    prof = build_profile(model, "h200", "chat", measure=False, entropy=False, gpus=8)
    plan = match_profile([], prof, feasible=False)  # the method, whatever layout fits
    choices = plan.space["spec.method"].choices if "spec.method" in plan.space else [plan.fixed["spec.method"].value]
    assert "dspark" not in choices and method in choices
    p = _params(**{"spec.method": method, "parallel.tp": 8, "parallel.ep": 1, "weights.dtype": "auto"})
    env = template_env()
    common = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H200", "model_name": model}
    sh = env.get_template(SGLANG_TEMPLATE).render(**common, **sglang_context(prof, p, max_seq_len=4096))
    assert f"--speculative-algorithm {algorithm}" in sh and "DRAFT_MODEL_PATH" not in sh
    assert "DSPARK" not in sh and "SGLANG_RAGGED_VERIFY_MODE" not in sh
    ctx = vllm_context(prof, p, max_seq_len=4096)
    spec = json.loads(env.get_template(VLLM_TEMPLATES[0]).render(**common, **ctx))
    assert spec["method"] == method and "model" not in spec and spec["num_speculative_tokens"] == 4
    assert "DRAFT_MODEL_PATH" not in env.get_template(VLLM_TEMPLATES[1]).render(**common, **ctx)


def test_a_simulated_study_can_turn_speculation_off():
    """At a big decode batch speculation loses on a GPU: plain decoding is a searched method of a simulated study
    too (speculation off), never where a rule fixes spec.enabled."""
    from tuner.space import SearchSpace, with_plain
    from tuner.study import StudySpec

    prof = _profile(**DSPARK)
    plan = match_profile([], prof)
    space = StudySpec(profile=prof.model_dump(mode="json"), plan=plan.model_dump(mode="json")).space()
    assert "plain" in space.distributions["spec.method"].choices
    assert space.params_of({"spec.method": "plain"})["spec.enabled"] is False
    from optuna.distributions import CategoricalDistribution

    no_plain = {**space.distributions, "spec.method": CategoricalDistribution(["dspark", "ngram"])}
    kept = with_plain(SearchSpace(no_plain, {**space.fixed, "spec.enabled": False}, space.defaults, {}))
    assert kept.distributions["spec.method"].choices == ("dspark", "ngram")


def test_a_drafters_low_acceptance_starts_the_study_at_plain_instead_of_fixing_every_method_off():
    """The low-acceptance rule reads the profiled drafter's tau: with several methods searched, speculation off is
    where the study starts (spec.method plain), not a fixed value that leaves n-gram and suffix inert; any other
    rule fixing it off still fixes it."""
    from optuna.distributions import CategoricalDistribution

    from kb.match import FixedEntry, Plan
    from tuner.space import LOW_ACCEPTANCE_OFF, SearchSpace, methods_decide, with_plain

    space = SearchSpace({"spec.method": CategoricalDistribution(["dspark", "ngram", "suffix"])},
                        {"spec.enabled": False, "weights.dtype": "bf16"}, {}, {"spec.method": "dspark"})
    plan = Plan(fixed={"spec.enabled": FixedEntry(value=False, rules=[LOW_ACCEPTANCE_OFF], why="")})
    out = with_plain(methods_decide(space, plan))
    assert "spec.enabled" not in out.fixed and out.fixed["weights.dtype"] == "bf16"
    assert list(out.distributions["spec.method"].choices) == ["dspark", "ngram", "suffix", "plain"]
    assert out.warm_start["spec.method"] == "plain"
    assert out.params_of({"spec.method": "ngram"})["spec.enabled"] is True  # every trial says whether it speculates
    assert out.params_of({"spec.method": "plain"})["spec.enabled"] is False
    other = Plan(fixed={"spec.enabled": FixedEntry(value=False, rules=["stability.some-bug"], why="")})
    assert methods_decide(space, other) is space
    one = SearchSpace({}, {"spec.enabled": False, "spec.method": "dspark"}, {}, {})
    assert methods_decide(one, plan) is one
