"""`tune --deploy sglang|vllm|both`: the search holds only what the named engines run, and the bundle ships only
their scripts, each of which then runs as shipped."""

from __future__ import annotations

import json

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

import cli
from tests.tuner.test_bundle_scripts import run_script
from tuner.deploy import restrict, why_not
from tuner.errors import TunerError
from tuner.space import SearchSpace


def space(**cats) -> SearchSpace:
    dists = {k: CategoricalDistribution(v) for k, v in cats.items()}
    dists["spec.block_size"] = IntDistribution(2, 8)
    return SearchSpace(dists, {}, {"spec.head": "markov"}, {k: v[-1] for k, v in cats.items()})


def test_each_engine_searches_only_what_it_runs():
    s = space(**{"spec.method": ["dspark", "eagle3", "suffix"], "spec.head": ["markov", "rnn", "none"]})
    sgl = restrict(s, "sglang")
    assert sgl.distributions["spec.method"].choices == ("dspark", "eagle3")
    assert sgl.distributions["spec.head"].choices == ("markov", "rnn", "none") and "spec.method" not in sgl.warm_start
    vll = restrict(s, "vllm")
    assert vll.distributions["spec.method"].choices == ("dspark", "eagle3", "suffix")
    assert vll.distributions["spec.head"].choices == ("markov", "none") and "spec.head" in vll.warm_start
    both = restrict(s, "both")
    assert both.distributions["spec.method"].choices == ("dspark", "eagle3")
    assert both.distributions["spec.head"].choices == ("markov", "none")
    assert restrict(s, None) is s  # a study stored before --deploy keeps its space (its trials stay valid)


def test_a_drafter_head_vllm_lacks_takes_dspark_out_or_is_one_line():
    s = SearchSpace({"spec.method": CategoricalDistribution(["dspark", "ngram"])}, {"spec.head": "rnn"}, {}, {})
    got = restrict(s, "vllm")
    assert "spec.method" not in got.distributions and got.fixed["spec.method"] == "ngram"
    only = SearchSpace({}, {"spec.head": "rnn", "spec.method": "dspark"}, {}, {})
    with pytest.raises(TunerError, match=r"--deploy both: the plan fixes spec.method = dspark, .*rnn head.*"
                                         r"choose --deploy sglang"):
        restrict(only, "both")
    assert restrict(only, "sglang").fixed == only.fixed
    suffix = space(**{"spec.method": ["suffix"]})
    with pytest.raises(TunerError, match=r"--deploy sglang: every spec.method the plan searches \(suffix\) SGLang"):
        restrict(suffix, "sglang")


def test_why_not_says_what_the_script_would():
    assert why_not("sglang", {"spec.method": "suffix"}) == "SGLang 0.5.23 has no suffix speculative decoding"
    assert "Markov" in why_not("vllm", {"spec.method": "dspark", "spec.head": "rnn"})
    assert why_not("vllm", {"spec.method": "dspark", "spec.head": "markov"}) is None
    assert why_not("sglang", {"spec.enabled": False, "spec.method": "suffix"}) is None


def test_a_bundle_ships_the_named_engines_scripts_and_each_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_DB", f"sqlite:///{tmp_path / 'kb.sqlite'}")
    assert cli.main(["profile", "--model", "llama-3.1-70b", "--gpu", "h200", "--drafter", "none"]) == 0
    for deploy, engines in (("vllm", ["vllm"]),):  # "both" (the default) is every other bundle test's
        out = tmp_path / deploy
        assert cli.main(["tune", "--trials", "3", "--deploy", deploy, "--out", str(out)]) in (0, 2)
        scripts = {f"{e}.sh" for e in engines}
        assert {p.name for p in out.glob("*.sh")} - {"dspark.sh"} == scripts
        assert json.loads((out / "provenance.json").read_text())["deploy"] == engines
        for script in scripts:
            code, argv, err = run_script(out / script, tmp_path, DRAFT_MODEL_PATH="/drafters/mine")
            assert code == 0 and argv, (script, err)  # runs as shipped: no head or method it refuses
    assert cli.main(["tune", "--deploy", "gpu"]) == 2
