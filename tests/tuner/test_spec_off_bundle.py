"""A bundle with speculation off names no speculative method: its scripts, vllm.json and report say plain decoding."""

from __future__ import annotations

import json

from profiler.build import build_profile
from tuner.launch import write_sglang, write_vllm
from tuner.report import method_line, varied_params
from tuner.space import engine_defaults
from tuner.targets import sglang_context, vllm_context


def test_speculation_off_scripts_do_not_mention_dspark(tmp_path):
    profile = build_profile("Qwen3-8B", "h100", "chat", measure=False)
    params = {**engine_defaults(), "spec.enabled": False}
    common = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H100-SXM", "model_name": "Qwen3-8B"}
    write_sglang(tmp_path, sglang_context(profile, params, False, 4096), common)
    write_vllm(tmp_path, vllm_context(profile, params, False, 4096), common)
    for name in ("sglang.sh", "vllm.sh", "vllm.json"):
        text = (tmp_path / name).read_text().replace("dspark-tune", "the tool")
        assert "dspark" not in text.lower() and "speculative-algorithm" not in text, (name, text[:600])
    assert json.loads((tmp_path / "vllm.json").read_text()) == {}  # vllm.sh passes no --speculative-config
    assert method_line(profile, params, {}) == "Speculation is off in the exported configuration."


def test_importances_only_over_parameters_that_varied():
    from types import SimpleNamespace

    trials = [SimpleNamespace(params={"a": a, "b": b, "c": 2.0}) for a, b in ((1, "x"), (2, "x"), (3, "y"))]
    assert varied_params(trials) == ["a", "b"]


def test_the_method_line_names_what_the_study_searched():
    """Where the study searched spec.method, the report names every searched method with its best trial (not the
    profile's drafters: a measured study also runs plain decoding and the hybrid)."""
    from types import SimpleNamespace

    from optuna.distributions import CategoricalDistribution

    from tuner.report import searched_methods

    dist = {"spec.method": CategoricalDistribution(["dspark", "ngram", "hybrid", "plain"])}
    trials = [SimpleNamespace(params={"spec.method": m}, values=[v], distributions=dist)
              for m, v in (("ngram", 42.4), ("hybrid", 37.3), ("ngram", 62.2), ("plain", 27.3))]
    best = searched_methods(trials, trials[2])
    assert list(best) == ["dspark", "ngram", "hybrid", "plain"]
    assert best["ngram"] == 62.2 and best["hybrid"] == 37.3 and best["dspark"] != best["dspark"]  # NaN: no trial
    profile = build_profile("Qwen3-8B", "h100", "chat", measure=False)
    line = method_line(profile, {"spec.method": "ngram"}, {}, best)
    assert line.startswith("Method: **ngram**, chosen among the methods the study searched (best trial of each: "
                           "dspark (no trial), ngram 62.2, hybrid 37.3, plain 27.3)")
    off = method_line(profile, {"spec.enabled": False}, {}, best)
    assert off.startswith("Speculation is off in the exported configuration: plain decoding, chosen among")
    assert searched_methods(trials, SimpleNamespace(distributions={})) == {}
    assert searched_methods(trials, trials[2], maximize=False)["ngram"] == 42.4  # a minimised objective: the least
    # speculation off is plain decoding, whatever spec.method the trial carries
    dist = {"spec.method": CategoricalDistribution(["dspark", "suffix"])}
    trials = [SimpleNamespace(params={"spec.method": "suffix", "spec.enabled": on}, values=[v], distributions=dist)
              for on, v in ((True, 30.2), (False, 41.5))]
    got = searched_methods(trials, trials[1])
    assert list(got) == ["dspark", "suffix", "plain"] and got["suffix"] == 30.2 and got["plain"] == 41.5


def test_the_parameter_table_names_the_methods_the_study_searched() -> None:
    """A measured study widens the plan's spec.method (plain and the hybrid added): the report's table says what was
    searched and what the plan had, not the plan's list alone."""
    from optuna.distributions import CategoricalDistribution

    from kb.match import Plan, SpaceEntry
    from tuner.report import _how
    from tuner.space import SearchSpace

    plan = Plan(space={"spec.method": SpaceEntry(kind="choices", choices=["dspark", "ngram"], type="cat",
                                                 rules=["drafter:available"], why="")})
    wide = SearchSpace({"spec.method": CategoricalDistribution(["dspark", "ngram", "hybrid", "plain"])}, {}, {}, {})
    assert _how("spec.method", wide, plan) == ("tuned over ['dspark', 'ngram', 'hybrid', 'plain'] (the plan's "
                                               "['dspark', 'ngram'], rules drafter:available; the study's own space)")
    same = SearchSpace({"spec.method": CategoricalDistribution(["dspark", "ngram"])}, {}, {}, {})
    assert _how("spec.method", same, plan) == "tuned over ['dspark', 'ngram'] (rules drafter:available)"
