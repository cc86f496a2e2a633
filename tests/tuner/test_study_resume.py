"""Trial counts and resume: N means N however many processes tune one study; an interrupted study resumes its
screen and ends where an uninterrupted one does; a retried trial starts clean; creation races and bad names are
one line."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.tuner.fixtures import PLAN, QWEN3_8B_H100
from tests.tuner.test_study import make_study, trials_of
from tuner import study as st
from tuner.errors import TunerError

ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_on_one_sqlite_study_end_at_exactly_n(tmp_path):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "two")
    # both are worker 0 of their own `tune`: both screen, both aim at 14 in total
    procs = [subprocess.Popen([sys.executable, "-m", "tuner.worker", url, "two", "14", "0"], cwd=ROOT)
             for _ in range(2)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    trials = trials_of(url, "two")
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 14
    keys = [tuple(sorted(t.params.items())) for t in done[:8]]  # the screen's moves: shared, not run twice
    assert len(set(keys)) == len(keys)


def test_an_interrupted_study_resumes_its_screen_and_ends_as_an_uninterrupted_one(tmp_path):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "whole")
    st.run(url, "whole", trials=40)
    make_study(url, "cut")
    st.run(url, "cut", trials=5)  # stopped inside the screen (Ctrl-C keeps what completed)
    st.run(url, "cut", trials=40)
    whole, cut = (sorted((t for t in trials_of(url, n) if t.state == TrialState.COMPLETE), key=lambda t: t.number)
                  for n in ("whole", "cut"))
    assert [t.params for t in cut] == [t.params for t in whole]
    assert [t.values for t in cut] == [t.values for t in whole]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_retried_trial_does_not_inherit_the_killed_attempts_constraints(tmp_path):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    d = make_study(url, "r").space().distributions["spec.block_size"]
    study = optuna.load_study(study_name="r", storage=st.storage(url))
    killed = study.ask()
    killed.suggest_int("spec.block_size", d.low, d.high, step=d.step)
    killed.set_constraint("slo_tpot", 3.0)
    killed.set_user_attr("metrics", {"throughput": 1.0})
    st._RetryStale(max_retry=2)(study, study.trials[killed.number])
    retry = [t for t in study.get_trials() if t.state == TrialState.WAITING][-1]
    assert retry.params == {"spec.block_size": killed.params["spec.block_size"]}
    assert not [k for k in retry.system_attrs if k.startswith("constraints")] and not retry.user_attrs
    assert retry.system_attrs["failed_trial"] == killed.number
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns "constraint value is ignored" on an inherited constraint
        st.run(url, "r", trials=2)


def test_creating_one_study_twice_joins_it(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    spec = make_study(url, "dup")
    real_create = optuna.create_study

    def lost_race(**kw):  # the other process's create_study committed between our check and ours
        real_create(**kw)

    monkeypatch.setattr(optuna, "get_all_study_summaries", lambda _s: [])
    monkeypatch.setattr(optuna, "create_study", lost_race)
    study = st.open_study(url, "dup", spec)
    assert study.study_name == "dup" and st.SPEC_ATTR in study.user_attrs
    other = st.StudySpec(profile=QWEN3_8B_H100, plan=PLAN, objectives=["throughput"])
    with pytest.raises(TunerError, match="exists with another"):
        st.open_study(url, "dup", other)


@pytest.mark.parametrize("name", ["a\nb", "", " lead", "x" * 129, "tab\there"])
def test_bad_study_names_are_refused(name, tmp_path):
    with pytest.raises(TunerError, match="study name"):
        st.check_name(name)


def test_bad_study_name_through_the_cli(capsys, tmp_path):
    import cli

    code = cli.main(["tune", "--model", "qwen3", "--gpu", "h100", "--study", "x" * 600, "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "study name" in err


def test_ctrl_c_is_one_line_and_keeps_the_study(tmp_path):
    import os
    import signal
    import time

    env = {**os.environ, "DSPARK_DB": f"sqlite:///{tmp_path / 'kb.sqlite'}"}
    cli = [sys.executable, str(ROOT / "cli.py")]
    assert subprocess.run([*cli, "profile", "--model", "qwen3"], env=env, capture_output=True).returncode == 0
    proc = subprocess.Popen([*cli, "tune", "--gpu", "h100", "--workers", "2", "--study", "c", "--out",
                             str(tmp_path / "b")], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    url = env["DSPARK_DB"]
    deadline = time.time() + 120
    while time.time() < deadline:  # interrupt once trials are running in both processes
        time.sleep(0.5)
        try:
            if len([t for t in trials_of(url, "c") if t.state == TrialState.COMPLETE]) >= 3:
                break
        except KeyError:  # study not created yet
            continue
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: study c keeps its")
    assert not (tmp_path / "b").exists()  # no bundle from a study cut short


def test_a_heartbeat_left_running_by_an_interrupted_start_is_stopped():
    """Ctrl-C inside Optuna's HeartbeatThread.start() skips its __exit__: the non-daemon thread would beat
    forever and the interpreter would hang after printing "interrupted" (seen under load in CI)."""
    from optuna.storages._heartbeat import HeartbeatThread

    from tuner.storage import stop_heartbeats

    class Beat:
        beats = 0

        def get_heartbeat_interval(self) -> int:
            return 60

        def record_heartbeat(self, _trial_id: int) -> None:
            Beat.beats += 1

    hb = HeartbeatThread(0, Beat())
    hb.start()  # started, and its context manager never exited
    assert stop_heartbeats() == 1
    hb._thread.join(timeout=5)
    assert not hb._thread.is_alive() and Beat.beats == 1
    assert stop_heartbeats() == 0
