"""`tune --engine sglang` end to end without a GPU: every trial's sglang.sh runs `python -m sglang.launch_server`,
which the stand-in interpreter (tests/live/sglang_python.py) parses with SGLang 0.5.23's own parser before it
serves the tiny target with our engine under SGLang's metric names. So the flags live SGLang trials pass meet
SGLang's parser, and the launch -> health -> load -> metrics -> stop loop runs as on a GPU machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.live.test_tune_live import ROOT, _servers_running, _trials, _tune

STANDIN = Path(__file__).with_name("sglang_standin.py")


@pytest.fixture(scope="module")
def sglang_python(tmp_path_factory) -> Path:
    """The stand-in interpreter (SGLang's parser installed from the package registry on first use)."""
    from tests.live.sglang_python import standin_python

    try:
        return standin_python(tmp_path_factory.mktemp("sglang"))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        if os.environ.get("CI"):
            pytest.fail(f"could not install SGLang's parser for the stand-in: {e}")
        pytest.skip(f"SGLang's parser could not be installed here (no package registry?): {e}")


def test_sglang_refuses_a_flag_it_does_not_have(sglang_python):
    r = subprocess.run([str(sglang_python), "-m", "sglang.launch_server", "--model-path",
                        str(ROOT / "dspark_core" / "assets" / "tiny" / "target"), "--speculative-bogus", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unrecognized arguments: --speculative-bogus" in r.stderr


@pytest.mark.slow  # ~50 s, the suite's longest; the suite keeps the parser check above and the live dspark-engine study
def test_a_live_sglang_study_runs_end_to_end(sglang_python, tmp_path, monkeypatch):
    db = tmp_path / "kb.sqlite"
    monkeypatch.setenv("DSPARK_DB", f"sqlite:///{db}")
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "bundle"
    r = _tune("--engine", "sglang", "--engine-python", str(sglang_python), "--model", "tiny", "--gpu", "h100",
              "--devices", "0-1", "--trials", "4", "--confirm", "0", "--concurrency", "2", "--trial-requests", "4",
              "--trial-max-tokens", "8", "--out", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    done = [t for t in _trials(os.environ["DSPARK_DB"]) if t.state.name == "COMPLETE"]
    assert len(done) == 4
    ran = [t for t in done if not t.user_attrs.get("same_server")]
    assert all(t.user_attrs["engine"] == "sglang 0.5.23" for t in done)
    assert all("fail_kind" not in t.user_attrs and t.user_attrs["metrics"]["throughput"] > 0 for t in ran), \
        [t.user_attrs.get("why") for t in ran]
    for t in ran:  # each server on its own group: TP x replicas of the two devices
        tp = int(t.params.get("parallel.tp", 1))
        assert set(t.user_attrs["devices"]) <= {0, 1} and len(t.user_attrs["devices"]) % tp == 0, \
            (t.params, t.user_attrs["devices"])
    text = (out / "sglang.sh").read_text()
    assert "python -m sglang.launch_server" in text  # the exported script is the one the trials ran
    assert not list((tmp_path / "state" / "servers").glob("*.json")) and not _servers_running(str(STANDIN.stem))
