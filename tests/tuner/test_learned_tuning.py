"""The learned verify length and block length as tuner choices: the profile finds the policies committed for its
drafter and hardware, the rules search them only where a policy exists and the load makes them worth a trial, the
simulator runs them as the engine does, a measured trial runs them in the engine, and the bundle ships them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from dspark_core.config import ASSETS, MODEL_ASSETS, load_config
from dspark_core.verification.gamma_policy import GammaPolicyFile
from dspark_core.verification.learned import PolicyFile
from kb.loader import load_rules
from kb.match import match_profile
from kb.sync import StoredRule
from profiler.drafter import committed_policies
from profiler.schema import HwProfile, Profile
from tests.tuner.fixtures import QWEN3_8B_H100
from tuner.engine_config import tuned_engine_config
from tuner.errors import TunerError
from tuner.launch import POLICY_FILES, write_dspark, write_sglang, write_vllm
from tuner.objective import SimulateEvaluator
from tuner.space import engine_defaults
from tuner.targets import sglang_context, vllm_context

SMOL = MODEL_ASSETS / "smollm2-135m"
POLICIES = {"verify_policy": str(SMOL / "policy_cpu_bf16_markov.json"),
            "gamma_policy": str(SMOL / "gamma_cpu_bf16_markov.json")}
COMMON = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H100-SXM", "model_name": "Qwen3-8B"}


def _profile(concurrency: int = 16, policies: bool = True) -> Profile:
    wl = {**QWEN3_8B_H100["workload"], "concurrency": concurrency}
    return Profile.model_validate({**QWEN3_8B_H100, "workload": wl, "drafter": POLICIES if policies else {}})


@cache
def _rules() -> tuple[StoredRule, ...]:
    return tuple(StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules())


def _values(plan, name: str) -> list:
    if name in plan.fixed:
        return [plan.fixed[name].value]
    if name in plan.space:
        return list(plan.space[name].choices or [])
    return []


def test_profile_finds_the_policies_committed_for_its_hardware(tmp_path):
    for name in ("policy_cpu_bf16_rnn.json", "policy_cpu_bf16_markov.json", "gamma_cpu_bf16_markov.json",
                 "policy_h100-sxm_bf16_markov.json"):
        (tmp_path / name).write_text("{}")
    cpu = HwProfile(name="cpu", arch="cpu", vendor="cpu")
    found, notes = committed_policies(tmp_path, cpu, "markov")
    assert Path(found["verify_policy"]).name == "policy_cpu_bf16_markov.json"  # the deployed head's first
    assert Path(found["gamma_policy"]).name == "gamma_cpu_bf16_markov.json" and len(notes) == 2
    assert Path(committed_policies(tmp_path, cpu, "rnn")[0]["verify_policy"]).name == "policy_cpu_bf16_rnn.json"
    h100 = HwProfile(name="H100-SXM", arch="hopper", vendor="nvidia")
    assert committed_policies(tmp_path, h100, "markov")[0] == {
        "verify_policy": str((tmp_path / "policy_h100-sxm_bf16_markov.json").resolve())}
    assert committed_policies(tmp_path, HwProfile(name="A100-80GB", arch="ampere"), "markov") == ({}, [])


def test_rules_search_learned_only_with_a_policy_and_under_load():
    loaded = match_profile(list(_rules()), _profile(8))
    assert "learned" in _values(loaded, "spec.scheduler") and "prefix" in _values(loaded, "spec.scheduler")
    assert _values(loaded, "spec.gamma_policy") == ["static", "learned"]
    busy = match_profile(list(_rules()), _profile(32))  # beyond the 16-request rounds both policies learned from
    assert "learned" not in _values(busy, "spec.scheduler") and "spec.gamma_policy" not in busy.space
    idle = match_profile(list(_rules()), _profile(1))  # verify length: ties at concurrency 1, not worth a trial
    assert "learned" not in _values(idle, "spec.scheduler") and _values(idle, "spec.gamma_policy") == ["static",
                                                                                                     "learned"]
    bare = match_profile(list(_rules()), _profile(16, policies=False))
    assert "learned" not in _values(bare, "spec.scheduler") and "spec.gamma_policy" not in bare.space


def _params(**kw) -> dict:
    return {**engine_defaults(), "spec.block_size": 7, "spec.scheduler": "prefix", "batch.max_requests": 16, **kw}


def test_simulator_runs_the_learned_choices_and_a_hopeless_block_policy_is_plain_decoding(tmp_path):
    ev = SimulateEvaluator(_profile(), n_requests=24, repeats=1)
    learned = ev.evaluate(_params(**{"spec.scheduler": "learned", "spec.gamma_policy": "learned"}), seed=0)
    assert learned.feasible and learned.metrics["throughput"] > 0
    assert learned.metrics != ev.evaluate(_params(), seed=0).metrics
    # a block policy that expects nothing to survive never drafts: exactly plain decoding's clock
    g = GammaPolicyFile.load(POLICIES["gamma_policy"])
    hopeless = g.model_copy(update={"shift": -60.0})
    path = hopeless.save(tmp_path / "gamma.json")
    prof = _profile().model_copy(update={"drafter": _profile().drafter.model_copy(update={"gamma_policy": str(path)})})
    ev2 = SimulateEvaluator(prof, n_requests=24, repeats=1)
    never = ev2.evaluate(_params(**{"spec.gamma_policy": "learned"}), seed=0).metrics
    plain = ev2.evaluate(_params(**{"spec.enabled": False}), seed=0).metrics
    assert never["tau"] == 1.0 and never["throughput"] == pytest.approx(plain["throughput"], rel=1e-12)


def test_a_learned_choice_without_its_policy_is_one_line_naming_the_trainer_or_an_infeasible_trial():
    with pytest.raises(TunerError, match="no drafter.gamma_policy.*train-gamma-policy"):
        tuned_engine_config(_profile(policies=False), _params(**{"spec.gamma_policy": "learned"}), None)
    # a search without rules may draw it: an infeasible point with that line as its reason, not a crash
    out = SimulateEvaluator(_profile(policies=False), n_requests=8, repeats=1).evaluate(
        _params(**{"spec.scheduler": "learned"}), seed=0)
    assert not out.feasible and "no drafter.verify_policy" in out.why and "train-policy" in out.why


def test_bundle_ships_the_policies_and_the_peers_say_they_run_the_nearest(tmp_path):
    prof = _profile()
    params = _params(**{"spec.scheduler": "learned", "spec.gamma_policy": "learned"})
    cfg = tuned_engine_config(prof, params, "drafter")
    sps = SimulateEvaluator(prof, n_requests=8, repeats=1).sps_table(params)
    write_dspark(tmp_path, cfg, sps, {}, COMMON)
    for key, name in POLICY_FILES.items():
        assert (tmp_path / name).read_bytes() == Path(POLICIES["verify_policy" if key == "policy_path"
                                                              else "gamma_policy"]).read_bytes()
    loaded = load_config(tmp_path / "dspark.yaml")  # bundle-relative paths resolve beside dspark.yaml
    assert loaded.spec.scheduler == "learned" and loaded.spec.gamma_policy == "learned"
    PolicyFile.load(loaded.spec.policy_path)
    GammaPolicyFile.load(loaded.spec.gamma_policy_path)
    write_sglang(tmp_path, sglang_context(prof, params), COMMON)
    write_vllm(tmp_path, vllm_context(prof, params), COMMON)
    sg, vl = (tmp_path / "sglang.sh").read_text(), (tmp_path / "vllm.sh").read_text()
    assert 'SGLANG_RAGGED_VERIFY_MODE:-compact' in sg and "no learned scheduler" in sg and "learned per-round" in sg
    assert "learned per-round block" in vl and "learned scheduler (policy.json)" in vl
    assert json.loads((tmp_path / "vllm.json").read_text())["enable_adaptive_verification"]
    static = _params()
    write_sglang(tmp_path, sglang_context(prof, static), COMMON)
    assert "learned" not in (tmp_path / "sglang.sh").read_text()


def test_a_measured_trial_runs_both_learned_policies_in_the_engine():
    """The policies are feature models, not tied to a vocabulary: the tiny target runs SmolLM2's."""
    import torch

    from tuner.measure import MeasureEvaluator

    torch.set_num_threads(1)
    ev = MeasureEvaluator(Profile.model_validate({"hw": {"arch": "cpu", "name": "cpu"}, "drafter": POLICIES}),
                          n_prompts=2, max_new_tokens=10)
    params = {**engine_defaults(), "spec.scheduler": "learned", "spec.gamma_policy": "learned",
              "spec.block_size": 4, "batch.max_requests": 2}
    cfg = ev.config(params)
    assert cfg.spec.policy_path == POLICIES["verify_policy"] and cfg.spec.gamma_policy_path == POLICIES["gamma_policy"]
    out = ev.evaluate(params)
    assert out.feasible, out.why
    assert out.metrics["throughput"] > 0 and str(ASSETS) in str(ev.path.resolve())


def test_the_screen_tries_the_learned_block_where_the_plan_searches_it():
    """The study's first trials vary spec.gamma_policy one at a time from the start point, so TPE sees both."""
    import optuna

    from tuner.design import screen, start_point
    from tuner.space import space_from_plan

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_from_plan(match_profile(list(_rules()), _profile(8)))
    assert start_point(space)["spec.gamma_policy"] == "static"
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    screen(study, space, lambda t: float(space.suggest(t)["spec.gamma_policy"] == "learned"), budget=20,
           score=lambda t: t.value)
    tried = [t.params.get("spec.gamma_policy") for t in study.trials]
    assert tried[0] == "static" and "learned" in tried  # after the capacity and block-length moves
