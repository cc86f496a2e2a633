"""Studies on the knowledge-base URL: resume after a killed worker, worker processes, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from kb.db import open_db
from tests.tuner.fixtures import PLAN, QWEN3_8B_H100
from tuner import study as st
from tuner.errors import TunerError
from tuner.export import export_study

ROOT = Path(__file__).resolve().parents[2]


def make_study(url: str, name: str, **kw) -> st.StudySpec:
    open_db(url)
    spec = st.StudySpec(profile=QWEN3_8B_H100, plan=PLAN, n_requests=12, slo_tpot_ms=50, **kw)
    st.open_study(url, name, spec)
    return spec


def trials_of(url: str, name: str):
    return optuna.load_study(study_name=name, storage=st.storage(url)).trials


def test_warm_start_is_the_first_trial_and_exact_count(tmp_path):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "s")
    st.run(url, "s", trials=5)
    trials = trials_of(url, "s")
    assert len(trials) == 5 and trials[0].params["spec.block_size"] == 7
    st.run(url, "s", trials=5)  # already there: nothing more
    assert len(trials_of(url, "s")) == 5


def test_resume_after_kill_loses_no_completed_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_HEARTBEAT_S", "1")
    monkeypatch.setenv("DSPARK_HEARTBEAT_GRACE_S", "2")
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "k")
    env = {**os.environ, "DSPARK_HEARTBEAT_S": "1", "DSPARK_HEARTBEAT_GRACE_S": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "tuner.worker", url, "k", "200", "1"], cwd=ROOT, env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        done = [t for t in trials_of(url, "k") if t.state == TrialState.COMPLETE]
        if len(done) >= 3:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: t.values for t in trials_of(url, "k") if t.state == TrialState.COMPLETE}
    assert len(before) >= 3
    # let the killed worker's heartbeat go stale: SQLite's CURRENT_TIMESTAMP has whole seconds, so a beat up to
    # one interval before the kill can look grace + 1 s old only after grace + interval + 1 s of real time
    time.sleep(4.2)
    st.run(url, "k", trials=len(before) + 3)
    after = trials_of(url, "k")
    complete = {t.number: t.values for t in after if t.state == TrialState.COMPLETE}
    assert all(complete[n] == v for n, v in before.items())  # nothing completed was lost or changed
    assert len(complete) == len(before) + 3
    assert not [t for t in after if t.state == TrialState.RUNNING]  # stale trial failed, not left running


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_orphan_without_heartbeat_is_failed_but_a_beating_trial_is_not(tmp_path, monkeypatch):
    # A worker killed after its objective suggested parameters but before the heartbeat thread's first beat
    # leaves a RUNNING trial Optuna never counts as stale; resume must fail it, and only it.
    monkeypatch.setenv("DSPARK_HEARTBEAT_GRACE_S", "1")
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "o")
    study = optuna.load_study(study_name="o", storage=st.storage(url))
    orphan, beating = study.ask(), study.ask()
    orphan.suggest_int("spec.block_size", 2, 16)
    time.sleep(1.1)  # both older than the grace period
    study._storage.record_heartbeat(beating._trial_id)
    assert st.fail_orphans(study) == 1
    states = {t.number: t.state for t in trials_of(url, "o")}
    assert states == {orphan.number: TrialState.FAIL, beating.number: TrialState.RUNNING}


def test_two_workers_on_postgres_exact_count_no_duplicates(db_url):
    make_study(db_url, "w")
    st.run(db_url, "w", trials=8, workers=2)
    trials = trials_of(db_url, "w")
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 8 and len({t._trial_id for t in done}) == 8
    # a worker that started a trial as the other filled the study gives it up before it runs (pruned, no params)
    assert all(t.state == TrialState.PRUNED and not t.params for t in trials if t not in done)


def test_export_bundle_formats_and_atomicity(tmp_path):
    from dspark_core.config import load_config

    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "e")
    st.run(url, "e", trials=4)
    out = tmp_path / "bundle"
    res = export_study(url, "e", out)
    assert res.meets_slo and {"dspark.yaml", "sglang.sh", "sps.json", "sts.json", "vllm.json", "vllm.sh",
                              "report.md", "provenance.json", "sps.png"} <= set(res.files)
    cfg = load_config(out / "dspark.yaml")
    assert cfg.spec.block_size == res.params["spec.block_size"] and cfg.spec.head == "markov"
    sps = json.loads((out / "sps.json").read_text())
    assert set(sps) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    assert sps["sample_batch_tokens"] == sorted(set(sps["sample_batch_tokens"]))
    assert sps["max_batch_tokens"] >= sps["sample_batch_tokens"][-1]
    sts = json.loads((out / "sts.json").read_text())
    assert len(sts["temperatures"]) == cfg.spec.block_size and all(t > 0 for t in sts["temperatures"])
    sh = (out / "sglang.sh").read_text()
    assert f"--speculative-dspark-block-size {cfg.spec.block_size}" in sh and "--speculative-algorithm DSPARK" in sh
    report = (out / "report.md").read_text()
    assert "SIMULATED" in report and "r.gamma" in report

    # an export that fails half-way leaves the previous bundle untouched
    import tuner.export as ex

    def boom(*a, **k):
        raise RuntimeError("disk full")

    orig = ex.sts_payload
    ex.sts_payload = boom
    try:
        with pytest.raises(RuntimeError):
            export_study(url, "e", out)
    finally:
        ex.sts_payload = orig
    assert (out / "report.md").read_text() == report
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle")]

    # `export --trial N`: that completed trial, whatever the best is; an unknown one is one line naming the others
    done = [t.number for t in trials_of(url, "e") if t.state == TrialState.COMPLETE]
    other = next(n for n in done if n != res.trial_number)
    picked = export_study(url, "e", tmp_path / "picked", other)
    prov = json.loads((tmp_path / "picked" / "provenance.json").read_text())
    assert picked.trial_number == prov["trial"] == other
    with pytest.raises(TunerError, match=r"--trial 99: study 'e' has no completed trial 99 \(completed: 0, "):
        export_study(url, "e", tmp_path / "nope", 99)
    assert not (tmp_path / "nope").exists()


def test_unwritable_out_and_unknown_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "u")
    st.run(url, "u", trials=2)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TunerError, match="not a folder"):
        export_study(url, "u", blocker)
    with pytest.raises(TunerError, match="cannot"):
        export_study(url, "u", Path("/proc/nope/bundle"))
    with pytest.raises(TunerError, match="no study named"):
        export_study(url, "missing", tmp_path / "b")


def test_bundle_carries_tuned_kernel_configs(tmp_path):
    from tuner.kernels import KernelResult, gpu_key, save_results

    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "kc")
    st.run(url, "kc", trials=2)
    out = tmp_path / "b"
    assert "kernels.json" not in export_study(url, "kc", out).files  # nothing tuned for this GPU yet
    save_results(open_db(url), [KernelResult("rmsnorm", gpu_key("H100-SXM"), "H4096", {"hidden": 4096},
                                             {"BLOCK": 1024, "num_warps": 8}, 0.01, 0.02)], "3.x")
    assert "kernels.json" in export_study(url, "kc", out).files
    data = json.loads((out / "kernels.json").read_text())
    assert data["configs"]["rmsnorm"]["H4096"]["BLOCK"] == 1024
    from dspark_core.config import load_config

    assert load_config(out / "dspark.yaml").kernel_file == str(out / "kernels.json")
