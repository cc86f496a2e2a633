"""`tune --engine ... --devices`: one server per device group, side by side, on leases no two servers share; a
server that runs on another group's devices fails its trial; tuners with disjoint devices share one study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.live.test_tune_live import FAKE, ROOT, SMALL, _servers_running, _trials, _tune, state, tiny_kb  # noqa: F401
from tuner.errors import TunerError
from tuner.live import devices as dv


@pytest.mark.parametrize(("spec", "ids"), [("0-3", [0, 1, 2, 3]), ("0,2,5-6", [0, 2, 5, 6]), ("7", [7]),
                                           (" 1-2,0 ", [0, 1, 2])])
def test_device_specs(spec, ids):
    assert dv.parse_devices(spec) == ids


@pytest.mark.parametrize(("spec", "says"), [("3-1", "runs backwards"), ("gpu0", "give device ids"), ("", "give"),
                                            ("0-99999", "give device ids"), ("0-300", "more than 256")])
def test_bad_device_specs_are_one_line(spec, says):
    with pytest.raises(TunerError, match=says):
        dv.parse_devices(spec)


def test_auto_takes_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert dv.parse_devices("auto") == [0, 1]  # a child sees its visible devices renumbered from 0


def test_leases_are_disjoint_aligned_and_freed(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path))
    a = dv.try_lease([0, 1, 2, 3], 2)
    b = dv.try_lease([0, 1, 2, 3], 2)
    assert a is not None and b is not None and {a.devices, b.devices} == {(0, 1), (2, 3)}
    assert a.env == {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}
    assert dv.try_lease([0, 1, 2, 3], 1) is None  # every device held
    a.release()
    c = dv.try_lease([0, 1, 2, 3], 1)
    assert c is not None and c.devices == (0,)
    with pytest.raises(TunerError, match="needs 8 devices"):
        dv.lease([0, 1, 2, 3], 8)
    b.release()
    c.release()


def test_a_killed_holder_frees_its_devices(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path))
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from tuner.live.devices import lease; "
            "held = lease([0, 1], 2); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(ROOT)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "DSPARK_STATE_DIR": str(tmp_path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert dv.try_lease([0, 1], 1) is None
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        got = dv.try_lease([0, 1], 2)
        assert got is not None and got.devices == (0, 1)
        got.release()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_waiters_are_served_in_order_and_dead_ones_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = dv._ticket([0, 1])
    queue = mine.parent
    (queue / f"{0:020d}-{dead.pid}-1-0").touch()  # an earlier waiter whose process is gone: skipped, removed
    assert dv._first(mine) and len(list(queue.iterdir())) == 1
    (queue / "0-notes").touch()  # not a ticket: no waiter, and not removed
    later = dv._ticket([0, 1])
    assert not dv._first(later)  # behind this process's own, still live, ticket
    mine.unlink()
    assert dv._first(later) and (queue / "0-notes").is_file()
    assert dv._ticket([2, 3]).parent != queue  # other devices: another queue


def test_live_usage_errors_are_one_line(state, tmp_path):  # noqa: F811
    for args, says in ((["--devices", "0-1"], "--devices places the servers of a live study"),
                       (["--engine", "fake", "--workers", "2"], "unless --devices"),
                       (["--engine", "fake", "--devices", "0-1", "--workers", "3"], "more servers than the 2"),
                       (["--engine", "fake", "--devices", "1-0"], "runs backwards")):
        r = _tune(*args, "--out", str(tmp_path / "b"), fake=True)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-600:])


def test_a_server_on_another_groups_devices_fails_its_trial(state, tmp_path):  # noqa: F811
    r = _tune("--engine", "fake", "--devices", "0", "--trials", "2", "--confirm", "0", "--out", str(tmp_path / "b"),
              *SMALL, env={"FAKE_ENGINE_MODES": "wrongdev,ok"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = _trials(os.environ["DSPARK_DB"])[:2]
    assert first.user_attrs["fail_kind"] == "devices" and "CUDA_VISIBLE_DEVICES=99" in first.user_attrs["why"]
    assert second.user_attrs["devices"] == [0] and "fail_kind" not in second.user_attrs


def _overlap(a, b) -> bool:
    return a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete


def test_trials_run_side_by_side_on_disjoint_groups(state, tmp_path):  # noqa: F811
    out = tmp_path / "b"
    r = _tune("--engine", "fake", "--devices", "0-2", "--trials", "3", "--confirm", "0", "--out", str(out),
              "--concurrency", "2", "--trial-requests", "4", "--trial-max-tokens", "40", "--json",
              env={"FAKE_TOKEN_S": "0.02"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    done = [t for t in _trials(os.environ["DSPARK_DB"]) if t.state.name == "COMPLETE"]
    assert len(done) == 3 and all("fail_kind" not in t.user_attrs for t in done)
    ran = [t for t in done if not t.user_attrs.get("same_server")]
    assert all(len(t.user_attrs["devices"]) == 1 and 0 <= t.user_attrs["devices"][0] <= 2 for t in ran)
    pairs = [(a, b) for i, a in enumerate(ran) for b in ran[i + 1:] if _overlap(a, b)]
    assert pairs, "no two trials ran at once"
    assert all(a.user_attrs["devices"] != b.user_attrs["devices"] for a, b in pairs)  # never one device twice
    params = [json.dumps(dict(t.params), sort_keys=True) for t in done]
    assert len(set(params)) == len(params)  # no configuration measured twice
    assert "ran side by side" in (out / "report.md").read_text()
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(FAKE.with_name("fake_server")))


@pytest.mark.slow  # ~30 s; the suite keeps a killed holder freeing its devices and the pidfile reaping (test_tune_live)
def test_kill_9_of_a_tuner_with_devices_leaves_no_server(state, tmp_path):  # noqa: F811
    db = os.environ["DSPARK_DB"]
    args = ["--engine", "fake", "--devices", "0-1", "--study", "killed", "--out", str(tmp_path / "b"),
            "--concurrency", "1", "--trial-requests", "4", "--trial-max-tokens", "60", "--confirm", "0", "--json"]
    env = {**os.environ, "FAKE_ENGINE_MODES": "ok", "FAKE_TOKEN_S": "0.02", "DSPARK_HEARTBEAT_S": "1",
           "DSPARK_HEARTBEAT_GRACE_S": "3"}
    proc = subprocess.Popen([sys.executable, str(FAKE), "tune", "--trials", "3", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    most = 0
    try:
        deadline = time.time() + 240
        while time.time() < deadline:  # a trial complete and a server running
            time.sleep(0.2)
            running = len(list((state / "servers").glob("*.json")))
            most = max(most, running)
            try:
                states = [t.state.name for t in _trials(db)]
            except Exception:  # noqa: BLE001 - the study is not created yet
                continue
            if "COMPLETE" in states and running:
                break
        else:
            pytest.fail("no trial completed")
        kept = sum(s == "COMPLETE" for s in states)
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert most == 2  # two servers ran at once
    time.sleep(4)  # the workers got SIGTERM as their tuner died and stopped their servers; past the grace
    assert not _servers_running(str(FAKE.with_name("fake_server")))
    r = _tune("--trials", "3", "--engine", "fake", "--devices", "0-1", "--study", "killed", "--out",
              str(tmp_path / "b"), "--json", env={"FAKE_ENGINE_MODES": "ok", "DSPARK_HEARTBEAT_S": "1",
                                                  "DSPARK_HEARTBEAT_GRACE_S": "3"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    done = [t for t in _trials(db) if t.state.name == "COMPLETE"]
    assert len(done) == 3 and len(done) >= kept
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(FAKE.with_name("fake_server")))


@pytest.mark.slow  # ~40 s; the suite keeps tests/tuner/test_study.py's two workers on one PostgreSQL study
def test_two_tuners_with_disjoint_devices_share_one_postgres_study(state, tmp_path, pg_url):  # noqa: F811
    url = pg_url
    env = {"DSPARK_DB": url, "FAKE_TOKEN_S": "0.03"}  # ~7 s a trial (the second tuner joins in time), TPOT
    # 30 ms (within the tiny profile's SLO)
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "profile", "--model", "tiny", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    common = ["--engine", "fake", "--study", "shared", "--trials", "4", "--confirm", "0", "--json"]
    first = subprocess.Popen([sys.executable, str(FAKE), "tune", *common, "--devices", "0-1", "--out",
                              str(tmp_path / "a"), "--concurrency", "2", "--trial-requests", "8",
                              "--trial-max-tokens", "60"], cwd=ROOT, env={**os.environ, **env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    import optuna

    while time.time() < deadline and not any(s.study_name == "shared"
                                             for s in optuna.get_all_study_summaries(url)):
        time.sleep(0.5)
    second = _tune(*common, "--devices", "2-3", "--out", str(tmp_path / "b"), env=env, fake=True)  # joins it
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, (err[-1500:], second.stderr[-1500:])
    trials = optuna.load_study(study_name="shared", storage=url).trials
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == 4  # exactly the target, between two tuners
    params = [json.dumps(dict(t.params), sort_keys=True) for t in done]
    assert len(set(params)) == len(params)  # no configuration twice
    used = {d for t in done for d in t.user_attrs.get("devices", [])}
    assert used <= {0, 1, 2, 3} and used & {2, 3}, used  # the second tuner ran trials, on its own devices


def test_a_failing_server_costs_its_trial_and_frees_its_group(state, tmp_path, monkeypatch):  # noqa: F811
    r = _tune("--engine", "fake", "--devices", "0-1", "--trials", "4", "--confirm", "0", "--startup-seconds", "3",
              "--out", str(tmp_path / "b"), *SMALL, env={"FAKE_ENGINE_MODES": "fail,hang,ok"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    done = [t for t in _trials(os.environ["DSPARK_DB"]) if t.state.name == "COMPLETE"]
    kinds = sorted(str(t.user_attrs.get("fail_kind")) for t in done)
    assert len(done) == 4 and kinds == ["None", "None", "startup_failed", "startup_timeout"], kinds
    assert all(len(t.user_attrs["devices"]) == 1 for t in done)  # every trial, failed or not, says where it ran
    monkeypatch.setenv("DSPARK_STATE_DIR", str(state))
    freed = dv.try_lease([0, 1], 2)  # no group is left held by a failed server
    assert freed is not None
    freed.release()
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(FAKE.with_name("fake_server")))
