"""What each live engine launches, without starting it: the launch files are the bundle's, only what the engine
reads is searched, a build's limits narrow the plan, and equal launch files mean one server."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_core.paths import ASSETS
from tuner.live.engines import DsparkEngine, Found, SglangEngine, VllmEngine

TINY = ASSETS / "target"


def _profile(gpu: str):
    from profiler.build import build_profile

    return build_profile(model=str(TINY), gpu=gpu, workload="chat", measure=False)


def _plan(profile):
    from kb.loader import load_rules
    from kb.match import match_profile
    from kb.sync import StoredRule

    return match_profile([StoredRule(lr.rule, 1, lr.file, lr.line) for lr in load_rules()], profile)


def _params(profile, **kw):
    from tuner.space import space_from_plan

    space = space_from_plan(_plan(profile))
    from tuner.design import start_point

    return {**space.params_of(start_point(space)), **kw}


FOUND = Found("x", "1", "/usr/bin/python3", "/opt/engine/bin")


def _draft(tmp_path: Path) -> str:
    """The tiny target's AR draft under a name vLLM runs as draft_model (its repository path holds "dspark")."""
    link = tmp_path / "ar-draft"
    link.symlink_to(ASSETS / "draft")
    return str(link)


def test_vllm_cpu_build_runs_ngram_and_draft_model_only(tmp_path):
    profile = _profile("cpu")
    assert "dspark" not in VllmEngine(profile, TINY).narrow()["spec.method"]
    assert VllmEngine(profile, TINY).narrow()["spec.method"] == ["ngram"]  # draft_model needs --draft
    narrow = VllmEngine(profile, TINY, draft=_draft(tmp_path)).narrow()
    assert narrow["spec.method"] == ["ngram", "draft_model"] and narrow["memory.page_size"] == [32]


def test_vllm_launch_is_the_bundle_script_and_equal_files_mean_one_server(tmp_path):
    profile = _profile("cpu")
    eng = VllmEngine(profile, TINY, draft=_draft(tmp_path))
    p = _params(profile, **{"spec.method": "draft_model", "memory.page_size": 32})
    a, b, c = (tmp_path / n for n in "abc")
    for f in (a, b, c):
        f.mkdir()
    la = eng.write(a, p, 8001, FOUND)
    lb = eng.write(b, p, 8002, FOUND)
    lc = eng.write(c, {**p, "batch.max_requests": p["batch.max_requests"] + 1}, 8003, FOUND)
    assert la.argv[:2] == ["bash", str(a / "vllm.sh")] and la.argv[-2:] == ["--port", "8001"]
    assert la.env["PATH"].startswith("/opt/engine/bin") and la.env["VLLM_HOST_IP"] == "127.0.0.1"
    assert la.key() == lb.key() != lc.key()
    script = (a / "vllm.sh").read_text()
    assert "--block-size 32" in script and "--enforce-eager" in script and "VLLM_CPU_KVCACHE_SPACE" in script
    assert "--gpu-memory-utilization" not in script
    spec = (a / "vllm.json").read_text()
    assert '"method": "draft_model"' in spec and '"model"' in spec


def test_sglang_launch_on_a_gpu_profile(tmp_path):
    profile = _profile("h100")
    eng = SglangEngine(profile, TINY)
    launch = eng.write(tmp_path, _params(profile), 9000, FOUND)
    assert launch.argv[1] == str(tmp_path / "sglang.sh") and (tmp_path / "sps.json").is_file()
    assert "sglang.launch_server" in (tmp_path / "sglang.sh").read_text()
    with pytest.raises(Exception, match="GPUs only"):
        SglangEngine(_profile("cpu"), TINY).locate()


def test_live_space_searches_only_what_the_engine_reads():
    from tuner.study import StudySpec

    profile = _profile("cpu")
    plan = _plan(profile)
    spec = StudySpec(profile=profile.model_dump(mode="json", exclude_none=True), plan=plan.model_dump(mode="json"),
                     mode="live", engine="vllm")
    space = spec.space()
    from kb.params import param_spec

    assert all("vllm" in param_spec(n).readers for n in space.distributions), space.distributions
    assert "spec.max_verify_tokens" not in space.distributions  # the bundled engine's knob, not vLLM's
    assert {"spec.enabled", "batch.max_tokens"} <= set(space.distributions)  # vLLM's own knobs
    ours = StudySpec(**{**spec.model_dump(), "engine": "dspark"}).space()
    assert "spec.method" not in ours.distributions and "spec.scheduler" in ours.distributions


def test_dspark_launch_serves_the_tuned_config(tmp_path):
    from dspark_core.config import load_config

    profile = _profile("cpu")
    eng = DsparkEngine(profile, TINY)
    p = _params(profile, **{"batch.max_requests": 4})
    launch = eng.write(tmp_path, p, 8100, FOUND)
    assert launch.env["DSPARK_PYTHON"] == FOUND.python
    cfg = load_config(tmp_path / "dspark.yaml")
    assert cfg.batch.max_requests == 4 and cfg.spec.block_size == p["spec.block_size"]
    assert Path(cfg.spec.sps_path).name == "sps.json" and "serve --config" in (tmp_path / "dspark.sh").read_text()


def test_with_speculation_off_the_speculation_knobs_name_the_same_server(tmp_path):
    profile = _profile("cpu")
    eng = VllmEngine(profile, TINY)
    p = _params(profile, **{"spec.enabled": False, "memory.page_size": 32})
    a, b, c = (tmp_path / n for n in "abc")
    for f in (a, b, c):
        f.mkdir()
    ka = eng.write(a, p, 1, FOUND).key()
    kb = eng.write(b, {**p, "spec.block_size": p["spec.block_size"] + 1}, 2, FOUND).key()
    kc = eng.write(c, {**p, "spec.enabled": True, "spec.method": "ngram"}, 3, FOUND).key()
    assert ka == kb != kc
    assert "--speculative-config" not in (a / "vllm.sh").read_text()
