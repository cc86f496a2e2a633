"""A measured study runs the engine the bundle will run: compiled steps where torch.compile can build them, compiled
before a trial is timed, and a dspark.yaml that compiles them too (tuner/measure.py, tuner/launch.py)."""

from __future__ import annotations

import shutil

import pytest

from dspark_core.config import load_config
from profiler.schema import Profile
from tuner.errors import TunerError
from tuner.launch import write_dspark
from tuner.measure import MeasureEvaluator, can_compile, resolve_compile
from tuner.space import engine_defaults
from tuner.study import StudySpec, make_evaluator

HAS_CXX = can_compile("cpu") == ""  # the tuner's own test: a C++ compiler on PATH
CPU = Profile.model_validate({"hw": {"arch": "cpu", "name": "cpu"}})


def test_compiling_is_the_default_where_it_can_build_and_asking_for_it_where_it_cannot_is_one_line(monkeypatch):
    assert resolve_compile(False, "cpu") is False
    assert resolve_compile(None, "hopper", "simulate") is False
    with pytest.raises(TunerError, match="--compile: only a measured study .* this study is simulate"):
        resolve_compile(True, "hopper", "simulate")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "no C++ compiler" in can_compile("cpu")
    assert resolve_compile(None, "cpu") is False  # eager, as before: nothing here builds the steps
    with pytest.raises(TunerError, match="--compile: no C\\+\\+ compiler on PATH.*drop --compile"):
        resolve_compile(True, "cpu")
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/g++" if name == "g++" else None)
    assert can_compile("cpu") == "" and resolve_compile(None, "cpu") is True


def test_the_study_spec_carries_it_to_every_trial_and_the_report_names_it():
    spec = StudySpec(profile=CPU.model_dump(mode="json"), plan={}, mode="measure", compile=True, trial_tokens=16)
    ev = make_evaluator(spec)
    assert isinstance(ev, MeasureEvaluator) and ev.compile and ev.max_new_tokens == 16
    params = {**engine_defaults(), "spec.enabled": False, "batch.max_requests": 1}
    assert ev.config(params).compile is True
    assert "16 new tokens, compiled steps" in ev.describe()
    assert StudySpec.model_validate(spec.model_dump(mode="json")).compile is True
    assert StudySpec(profile=CPU.model_dump(mode="json"), plan={}).compile is False  # stored before it: eager


def test_a_compiled_bundle_profiles_its_own_steps_and_an_eager_one_reads_the_measured_table(tmp_path):
    """The trials' compiled engine priced its rounds by its own compiled (on a CPU packed) steps, profiled at
    start-up: the exported one must too, not the eager table sps.json holds for SGLang."""
    from tests.tuner.fixtures import profile
    from tuner.engine_config import tuned_engine_config
    from tuner.objective import SimulateEvaluator

    prof = profile()
    params = {**engine_defaults(), "spec.scheduler": "prefix"}
    sps = SimulateEvaluator(prof, n_requests=8, repeats=1).sps_table(params)
    common = {"study": "s", "trial_number": 0, "mode": "measure", "hw_name": "h100", "model_name": "qwen3"}
    for compiled in (True, False):
        folder = tmp_path / str(compiled)
        folder.mkdir()
        cfg = tuned_engine_config(prof, params, None)
        cfg.compile = compiled
        write_dspark(folder, cfg, sps, {}, common)
        loaded = load_config(folder / "dspark.yaml")
        assert loaded.compile is compiled and (loaded.spec.sps_path is None) is compiled
        assert (folder / "sps.json").is_file()  # SGLang's launch reads it either way


@pytest.mark.skipif(not HAS_CXX, reason="torch.compile on a CPU needs a C++ compiler")
def test_a_compiled_trial_compiles_its_shapes_before_it_is_timed_and_its_bundle_runs_them(tmp_path):
    import torch

    from dspark_core.engine import Engine
    from dspark_core.verification.sps import SpsTable
    from tuner.engine_config import tuned_engine_config

    torch.set_num_threads(1)
    ev = MeasureEvaluator(CPU, n_prompts=2, max_new_tokens=8, compile=True)
    params = {**engine_defaults(), "spec.enabled": False, "batch.max_requests": 1}
    out = ev.evaluate(params)
    assert out.feasible and out.metrics["throughput"] > 0
    step = ev.target.compiled
    assert step is not None and (1, 1, (), True) in step.seen and step.refused == 0
    cfg = tuned_engine_config(CPU, params, None, model_path=str(ev.path))  # as tuner/export.py builds it
    cfg.compile = ev.compile
    sps = SpsTable((1, 2), (100.0, 90.0), 8)  # sps.json is SGLang's; the compiled engine profiles its own steps
    write_dspark(tmp_path, cfg, sps, {}, {"study": "s", "trial_number": 0, "mode": "measure", "hw_name": "cpu",
                                          "model_name": "tiny"})
    shipped = load_config(tmp_path / "dspark.yaml")
    shipped.sampling.max_new_tokens = 6
    engine = Engine(shipped)
    assert engine.target.compiled is not None  # the shipped engine runs the compiled steps the trial measured
    assert len(engine.generate(["def f(x):"]).outputs[0].token_ids) == 6
    assert (1, 1, (), True) in engine.target.compiled.seen
