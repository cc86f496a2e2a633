"""`tune --engine`: trials against a live server launched per trial through the real entry point.

Our own `serve` on the tiny target (CI), and a fake engine (tests/live/fake_tune.py) that fails to start, hangs,
or dies mid-trial: each costs one failed trial with its reason, no completed trial is lost, and no server is left
running, not even after the tuner is killed with -9 and the study resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_tune.py")
SMALL = ["--concurrency", "2", "--trial-requests", "6", "--trial-max-tokens", "8", "--json"]  # the stored tiny profile


@pytest.fixture(scope="module")
def tiny_kb(tmp_path_factory) -> Path:
    """A knowledge base holding the tiny target's profile, built once: every tune here reuses it (no --model), as
    `profile --model tiny && tune ...` does, instead of measuring this machine again per test."""
    db = tmp_path_factory.mktemp("kb") / "kb.sqlite"
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "profile", "--model", "tiny", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "DSPARK_DB": f"sqlite:///{db}"})
    assert r.returncode == 0, r.stderr[-2000:]
    return db


@pytest.fixture
def state(tmp_path, monkeypatch, tiny_kb) -> Path:
    d = tmp_path / "state"
    db = tmp_path / "kb-tiny.sqlite"
    shutil.copyfile(tiny_kb, db)
    monkeypatch.setenv("DSPARK_DB", f"sqlite:///{db}")
    monkeypatch.setenv("DSPARK_STATE_DIR", str(d))
    monkeypatch.setenv("FAKE_ENGINE_STATE", str(tmp_path / "fake-starts"))
    return d


def _tune(*argv: str, env: dict[str, str] | None = None, fake: bool = False, timeout: float = 300
          ) -> subprocess.CompletedProcess:
    script = FAKE if fake else ROOT / "cli.py"
    return subprocess.run([sys.executable, str(script), "tune", *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def _servers_running(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (a test's own state folder or script). Where the test set
    DSPARK_STATE_DIR (the `state` fixture), only processes that inherited it count: servers another pytest-xdist
    worker's test started run the same script."""
    mine = os.environ.get("DSPARK_STATE_DIR", "").encode()
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                env = (p / "environ").read_bytes().split(b"\0") if mine else []
            except OSError:
                continue
            if marker in cmd and "pytest" not in cmd and (not mine or b"DSPARK_STATE_DIR=" + mine in env):
                out.append(int(p.name))
    return out


def _trials(db: str) -> list:
    import optuna

    name = optuna.get_all_study_summaries(db)[0].study_name
    return optuna.load_study(study_name=name, storage=db).trials


def test_dspark_engine_tunes_and_ships_the_script_it_ran(state, tmp_path):
    out = tmp_path / "bundle"
    r = _tune("--engine", "dspark", "--trials", "2", "--out", str(out), "--slo-ttft-ms", "0", "--slo-tpot-ms", "0",
              *SMALL)  # no SLO: what is checked is the export, not whether a loaded machine meets the workload's
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["mode"] == "live" and summary["trials"] == 2 and summary["metrics"]["throughput"] > 0
    trials = _trials(os.environ["DSPARK_DB"])
    assert all(t.user_attrs["engine"].startswith("dspark-tune") and t.user_attrs["server_starts"] >= 1
               for t in trials)
    assert all("predicted" in t.user_attrs for t in trials)  # the simulator's figure beside each measurement
    assert {"dspark.sh", "dspark.yaml", "sps.json", "drafter", "vllm.sh", "report.md"} <= set(os.listdir(out))
    assert "serve --config" in (out / "dspark.sh").read_text()
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(state))
    report = (out / "report.md").read_text()
    assert "predicted" in report and "dspark-tune" in report
    import optuna  # the finalists were measured again on fresh servers; the export is the best mean

    name = optuna.get_all_study_summaries(os.environ["DSPARK_DB"])[0].study_name
    again = optuna.load_study(study_name=name, storage=os.environ["DSPARK_DB"]).user_attrs["confirmations"]
    assert str(summary["trial"]) in again and summary["metrics"]["measurements"] == 2
    assert summary["metrics"]["throughput"] == pytest.approx(
        (summary["metrics"]["throughput_trial"] + again[str(summary["trial"])][0]["throughput"]) / 2)
    assert "measured again" in report

    from tests.serving import Server  # the shipped script serves the exported config as it is

    proc = subprocess.Popen(["bash", str(out / "dspark.sh"), "--port", "0", "--threads", "1"], stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "DSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stderr.readline()
        assert "serving" in line, line
        srv = Server.__new__(Server)
        srv.proc, srv.url, srv.api_key = proc, line.strip().rsplit(" ", 1)[-1], None
        status, body = srv.post("/completions", json.dumps({"prompt": "def f(", "max_tokens": 4}).encode())
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_startup_failures_cost_one_trial_each_with_their_reason(state, tmp_path):
    r = _tune("--engine", "fake", "--trials", "4", "--startup-seconds", "3", "--out", str(tmp_path / "b"), *SMALL,
              env={"FAKE_ENGINE_MODES": "fail,hang,ok,die,ok"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    trials = _trials(os.environ["DSPARK_DB"])
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    kinds = [t.user_attrs.get("fail_kind") for t in trials]
    assert kinds == ["startup_failed", "startup_timeout", None, "died"]
    assert "out of memory" in trials[0].user_attrs["why"] and "status 1" in trials[0].user_attrs["why"]
    assert "not healthy after 3 s" in trials[1].user_attrs["why"] and "loading weights" in trials[1].user_attrs["why"]
    assert "status 3" in trials[3].user_attrs["why"]
    assert Path(trials[0].user_attrs["server_log"]).is_file()  # the log of a failed start is kept
    assert json.loads(r.stdout)["trial"] == 2  # the one that ran is exported
    report = (tmp_path / "b" / "report.md").read_text()
    assert "startup_timeout" in report and "out of memory" in report
    assert not _servers_running(str(FAKE.with_name("fake_server.py"))) or not _servers_running(str(state))
    assert not list((state / "servers").glob("*.json"))


@pytest.mark.slow  # ~1 min; the suite keeps the unit check (test_reap_orphans_...) and the simulated kill tests
def test_kill_9_mid_trial_then_resume_leaves_no_server_and_keeps_trials(state, tmp_path):
    db = os.environ["DSPARK_DB"]
    args = ["--engine", "fake", "--study", "killed", "--out", str(tmp_path / "b"),
            "--concurrency", "1", "--trial-requests", "4", "--trial-max-tokens", "500", "--confirm", "0", "--json"]
    env = {**os.environ, "FAKE_ENGINE_MODES": "ok", "DSPARK_HEARTBEAT_S": "1", "DSPARK_HEARTBEAT_GRACE_S": "3"}
    proc = subprocess.Popen([sys.executable, str(FAKE), "tune", "--trials", "3", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:  # wait for trial 1 to run: trial 0 is complete, a server serves trial 1
            time.sleep(0.3)
            try:
                states = [t.state.name for t in _trials(db)]
            except Exception:  # noqa: BLE001 - the study is not created yet
                continue
            if states[:1] == ["COMPLETE"] and "RUNNING" in states and list((state / "servers").glob("*.json")):
                break
        else:
            pytest.fail("trial 1 never started")
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(4)  # past the heartbeat grace: the killed trial is stale
    r = _tune("--trials", "3", "--engine", "fake", "--study", "killed", "--out", str(tmp_path / "b"), "--json",
              env={"FAKE_ENGINE_MODES": "ok", "DSPARK_HEARTBEAT_S": "1", "DSPARK_HEARTBEAT_GRACE_S": "3"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    trials = _trials(db)
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == 3 and done[0].number == 0  # trial 0, completed before the kill, is kept
    assert any(t.state.name == "FAIL" for t in trials)  # the killed trial, failed and retried
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(FAKE.with_name("fake_server")))


def test_reap_orphans_stops_a_server_whose_tuner_is_gone(state):
    from tuner.live.process import _start_ticks, reap_orphans, servers_dir

    server = subprocess.Popen(["sleep", "120"], start_new_session=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    servers_dir().mkdir(parents=True)
    (servers_dir() / f"{server.pid}.json").write_text(json.dumps(
        {"pid": server.pid, "ticks": _start_ticks(server.pid), "owner": dead.pid, "owner_ticks": 1}))
    mine = subprocess.Popen(["sleep", "120"], start_new_session=True)  # owned by this (live) process: kept
    (servers_dir() / f"{mine.pid}.json").write_text(json.dumps(
        {"pid": mine.pid, "ticks": _start_ticks(mine.pid), "owner": os.getpid(),
         "owner_ticks": _start_ticks(os.getpid())}))
    try:
        assert reap_orphans() == [server.pid]
        assert server.wait(15) is not None and mine.poll() is None
        assert not (servers_dir() / f"{server.pid}.json").exists()
    finally:
        for p in (server, mine):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_engine_usage_errors_are_one_line(state, tmp_path, capsys):
    import cli

    misread = tmp_path / "dspark-tune" / "models" / "ar-draft"  # where our cache keeps assembled drafts
    misread.mkdir(parents=True)
    (misread / "config.json").write_text("{}")

    for argv, needle in ((["--engine", "tgi"], "--engine 'tgi'"), (["--engine", "vllm", "--mode", "simulate"],
                                                                  "drop --mode"),
                         (["--engine", "vllm", "--engine-python", str(tmp_path / "nope")], "no such interpreter"),
                         (["--engine", "vllm", "--draft", str(tmp_path)], "--draft"),
                         (["--engine", "vllm", "--draft", str(misread)], "would run this one as 'dspark'")):
        code = cli.main(["tune", "--model", "tiny", *argv, "--out", str(tmp_path / "b")])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and needle in err.strip().splitlines()[-1], err
    assert not (tmp_path / "b").exists()
    from tuner.live.engines import vllm_draft_misread

    (tmp_path / "ar-draft").symlink_to(misread)  # the advised way out: vLLM reads the path as given
    assert vllm_draft_misread(str(misread)) == "dspark" and vllm_draft_misread(str(tmp_path / "ar-draft")) is None


def test_rate_sweep_scores_the_highest_rate_that_meets_the_slos(state, tmp_path):
    r = _tune("--engine", "fake", "--trials", "1", "--load", "sweep", "--slo-ttft-ms", "5000", "--slo-tpot-ms", "500",
              "--out", str(tmp_path / "b"), *SMALL, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    t = _trials(os.environ["DSPARK_DB"])[0]
    sweep = t.user_attrs["sweep"]
    assert len(sweep) == 4 and sorted(p["rate"] for p in sweep) == [p["rate"] for p in sweep]
    assert t.user_attrs["metrics"]["rate_at_slo"] == max(p["rate"] for p in sweep)  # every rate meets these SLOs
