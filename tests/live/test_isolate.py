"""Measurements that run alone on this machine (exclusive leases: confirmations, `--isolate`'s alone runs), and
`tune --isolate`: the exported configuration alone and beside busy neighbours, reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.live.test_tune_live import FAKE, ROOT, _servers_running, _trials, _tune, state, tiny_kb  # noqa: F401
from tuner.live import devices as dv

HOLD = ("import sys, time; sys.path.insert(0, sys.argv[1]); from tuner.live.devices import lease; "
        "held = lease([int(d) for d in sys.argv[2].split(',')], 1, exclusive=sys.argv[3] == 'x'); "
        "print('held', flush=True); time.sleep(60)")


def _holder(tmp_path, devices: str, exclusive: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(ROOT), devices, "x" if exclusive else "s"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "DSPARK_STATE_DIR": str(tmp_path)})


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait(10)


def test_an_exclusive_lease_waits_for_every_server_and_keeps_new_ones_out(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path))
    other = _holder(tmp_path, "2,3", exclusive=False)  # another study's server, on other devices
    try:
        assert other.stdout.readline().strip() == "held"
        assert dv.try_lease([0, 1], 1, exclusive=True) is None  # it still runs: no measurement alone yet
        assert dv._waiting_at_gate  # ... but this waiter holds the gate meanwhile
        late = _holder(tmp_path, "2,3", exclusive=False)  # a server that would start after it: kept out
        try:
            time.sleep(1.0)
            assert late.poll() is None and not _ready(late)
            assert subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                                   "from tuner.live.devices import exclusive_waiting; print(exclusive_waiting())",
                                   str(ROOT)], capture_output=True, text=True,
                                  env={**os.environ, "DSPARK_STATE_DIR": str(tmp_path)}).stdout.strip() == "True"
            assert not dv.exclusive_waiting()  # our own waiting lease is no reason for us to stop
            _stop(other)  # the running server ends (kill -9: the kernel frees its hold)
            got = dv.try_lease([0, 1], 1, exclusive=True)
            assert got is not None and got.devices == (0,)
            assert dv.try_lease([0, 1], 1) is None  # nothing else while it lives, even a free device of its own
            time.sleep(0.5)
            assert not _ready(late)
            got.release()
            assert late.stdout.readline().strip() == "held"  # and then the late one starts
        finally:
            _stop(late)
    finally:
        _stop(other)
        dv._waiting_at_gate.clear()


def _ready(p: subprocess.Popen) -> bool:
    import select

    return bool(select.select([p.stdout], [], [], 0)[0])


def test_a_killed_exclusive_holder_frees_the_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_STATE_DIR", str(tmp_path))
    holder = _holder(tmp_path, "0", exclusive=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert dv.try_lease([1, 2], 1) is None
        _stop(holder)
        got = dv.try_lease([1, 2], 2)
        assert got is not None
        got.release()
    finally:
        _stop(holder)


def test_isolate_needs_an_engine_and_two_devices(state, tmp_path):  # noqa: F811
    for args, says in ((["--isolate"], "add --engine and --devices"),
                       (["--engine", "fake", "--isolate"], "give --devices with two or more"),
                       (["--engine", "fake", "--devices", "0", "--isolate"], "give --devices with two or more")):
        r = _tune(*args, "--out", str(tmp_path / "b"), fake=True)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-600:])


def test_isolate_measures_the_best_alone_and_beside_busy_neighbours(state, tmp_path):  # noqa: F811
    out = tmp_path / "b"
    r = _tune("--engine", "fake", "--devices", "0-2", "--trials", "2", "--confirm", "1", "--isolate", "--out",
              str(out), "--concurrency", "2", "--trial-requests", "4", "--trial-max-tokens", "12", "--json",
              env={"FAKE_TOKEN_S": "0.01"}, fake=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    iso = summary["isolation"]
    assert "skipped" not in iso, iso["skipped"]  # the check's own reason, when it could not run
    assert iso["trial"] == summary["trial"] and iso["neighbours"] == 2  # every other group of 0-2 busy
    assert len(iso["alone"]) == len(iso["beside"]) == 2 and min(iso["alone"] + iso["beside"]) > 0
    assert abs(iso["ratio"] - (sum(iso["beside"]) / sum(iso["alone"]))) < 1e-3
    assert 0.5 < iso["ratio"] < 1.5  # the fake server's time is a sleep: neighbours cost it little
    assert "beside / alone" in (out / "report.md").read_text()
    done = _trials(os.environ["DSPARK_DB"])
    assert len([t for t in done if t.state.name == "COMPLETE"]) == 2
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(FAKE.with_name("fake_server")))


def test_a_failed_isolate_check_is_said_and_the_bundle_still_exported(state, tmp_path):  # noqa: F811
    out = tmp_path / "b"
    r = _tune("--engine", "fake", "--devices", "0-1", "--trials", "1", "--confirm", "0", "--isolate", "--out",
              str(out), "--concurrency", "2", "--trial-requests", "4", "--trial-max-tokens", "12", "--json",
              env={"FAKE_TOKEN_S": "0.01", "FAKE_ENGINE_MODES": "ok,ok,fail"}, fake=True)  # the neighbour's start fails
    assert r.returncode == 0, r.stderr[-2000:]
    iso = json.loads(r.stdout)["isolation"]
    assert "neighbour server stopped" in iso["skipped"] and "out of memory" in iso["skipped"].lower(), iso
    assert (out / "report.md").is_file()
    assert not list((state / "servers").glob("*.json")) and not _servers_running(str(FAKE.with_name("fake_server")))


def _lifetimes(log) -> dict[int, dict]:
    """Each fake server's devices, start and stop (its stop: when it was told to, or never)."""
    out: dict[int, dict] = {}
    for line in log.read_text().splitlines():
        e = json.loads(line)
        out.setdefault(e["pid"], {"devices": e["devices"], "stop": float("inf")})[e["event"]] = e["t"]
    return out


@pytest.mark.slow  # ~35 s; the suite keeps the exclusive lease's own tests above (waits, keeps new leases out)
def test_a_confirmation_runs_with_no_other_tuners_server_on_the_machine(state, tmp_path):  # noqa: F811
    """Two tuners on one machine, disjoint devices: the first's confirmation waits until the second's running servers
    have stopped, keeps the second from starting more while it measures, and the second then goes on."""
    log = tmp_path / "servers.jsonl"
    env = {**os.environ, "FAKE_TOKEN_S": "0.02", "FAKE_SERVER_LOG": str(log)}
    load = ["--concurrency", "2", "--trial-requests", "4", "--trial-max-tokens", "20", "--json"]
    busy = subprocess.Popen([sys.executable, str(FAKE), "tune", "--engine", "fake", "--devices", "2-3", "--study",
                             "busy", "--trials", "10", "--confirm", "0", "--out", str(tmp_path / "b1"), *load],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (log.is_file() and _lifetimes(log)):  # the other study's first server is up
            assert time.time() < deadline and busy.poll() is None, busy.communicate()[1][-2000:]
            time.sleep(0.2)
        r = subprocess.run([sys.executable, str(FAKE), "tune", "--engine", "fake", "--devices", "0-1", "--study",
                            "first", "--trials", "1", "--confirm", "1", "--out", str(tmp_path / "b2"), *load],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        _, err = busy.communicate(timeout=300)
        assert busy.returncode == 0, err[-2000:]
    finally:
        if busy.poll() is None:
            busy.kill()
    servers = _lifetimes(log)
    mine = sorted((s for s in servers.values() if s["devices"] in ("0", "1")), key=lambda s: s["start"])
    others = [s for s in servers.values() if s["devices"] in ("2", "3")]
    confirm = mine[-1]  # the first tuner's last server: its finalist measured again
    assert len(mine) == 2 and confirm["stop"] < float("inf")
    assert not [s for s in others if s["start"] < confirm["stop"] and confirm["start"] < s["stop"]]
    assert any(s["stop"] <= confirm["start"] for s in others)  # the other study ran before it ...
    assert any(s["start"] >= confirm["stop"] for s in others)  # ... and went on after it


def test_an_idle_worker_stops_its_kept_server_when_a_measurement_waits_to_run_alone(monkeypatch):
    """Worker 0's screen waits on a move another worker runs; that move may be queued behind an exclusive lease (a
    confirmation), which waits on every running server: the waiting worker's kept server stops (its devices freed),
    or the three wait on each other (seen: one run in five of the two-tuner check above hung until its timeout)."""
    import tuner.live.evaluator as lev

    class Held:
        stopped = released = False

        def stop(self) -> None:
            self.stopped = True

        def release(self) -> None:
            self.released = True

    ev = object.__new__(lev.LiveEvaluator)
    for waiting in (False, True):
        server, held = Held(), Held()
        ev.server, ev.serving, ev.lease = server, "key", held
        monkeypatch.setattr(lev, "exclusive_waiting", lambda w=waiting: w)
        ev.idle()
        assert (server.stopped, held.released, ev.server is None, ev.lease is None) == (waiting,) * 4
