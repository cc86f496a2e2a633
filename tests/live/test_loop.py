"""The loop, through the real entry points: serve -> loadgen -> monitor -> profile --from-monitor -> tune. The
acceptance the tuner simulates is what the server measured; monitor's plot and bad usage behave."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from dspark_core.config import EngineConfig, save_config  # noqa: E402
from live.loadgen import Target, run  # noqa: E402
from live.traffic import plan_requests  # noqa: E402
from tests.serving import ROOT, Server, scrape  # noqa: E402


def _cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=600, env=env)
    if check:
        assert r.returncode == 0, r.stderr[-2000:]
    return r


def _dspark_config(tmp: Path, folder: Path | None) -> Path:
    """The tiny target with its Markov drafter, or (folder) SmolLM2-135M with its committed one, in fp32: bf16 is
    compute-bound on CPUs without AVX512-BF16 (7.5x a token's cost to verify 9), fp32 runs at memory speed on all."""
    cfg = EngineConfig(device="cpu")
    cfg.drafter.method = "dspark"
    cfg.spec.head, cfg.spec.block_size = "markov", 6
    cfg.batch.max_requests = 4
    cfg.model.max_seq_len = 256
    if folder is not None:
        cfg.model.path, cfg.weights.dtype, cfg.spec.block_size = str(folder), "fp32", 8
    return save_config(cfg, tmp / "dspark.yaml")


def _wait_for_first_sample(db: Path, mon: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until the monitor has stored its first scrape (a slow machine takes seconds to import the CLI)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert mon.poll() is None, mon.communicate()[1][-2000:]
        try:
            with sqlite3.connect(db) as con:
                if con.execute("SELECT count(*) FROM deployment_samples").fetchone()[0]:
                    return
        except sqlite3.OperationalError:  # not created yet
            pass
        time.sleep(0.1)
    raise AssertionError("the monitor stored no sample within a minute")


@pytest.fixture
def served(request) -> tuple[str, Path | None]:
    """(model name for profile, checkpoint folder): the real model where present (CI fetches it), else the tiny
    target. The loop is the same code for both; one run of it keeps the suite's time."""
    try:
        return "smollm2-135m", request.getfixturevalue("folder")
    except pytest.skip.Exception:
        return "tiny", None


def test_serve_loadgen_monitor_profile_tune(tmp_path: Path, served: tuple[str, Path | None]) -> None:
    import os

    model, folder = served
    env = dict(os.environ, DSPARK_DB=f"sqlite:///{tmp_path / 'kb.sqlite'}")
    s = Server(_dspark_config(tmp_path, folder), "--static")  # no SPS profiling at start: the loop is the point
    try:
        mon = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "monitor", "--url", s.url, "--interval", "0.3",
                                "--duration", "120", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env=env)
        _wait_for_first_sample(tmp_path / "kb.sqlite", mon)  # its first scrape lands before the traffic
        records, _ = run(Target.parse(s.url, None), plan_requests("code", 60, 24, seed=0), None, 4, 6.0)
        assert all(r.complete for r in records)
        time.sleep(1.0)  # a scrape after the last response, however long the traffic took on this machine
        mon.send_signal(signal.SIGINT)  # Ctrl-C: the watch ends between samples and reports its window
        out, err = mon.communicate(timeout=60)
        assert mon.returncode == 0, err[-2000:]
        watched = json.loads(out)
        server = scrape(s)  # the server's own cumulative counters: all the traffic there was
    finally:
        assert s.stop() == 0
    assert watched["kind"] == "dspark" and watched["samples"] >= 5
    block = 8 if folder is not None else 6
    accepted = [server[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(p))] for p in range(block)]
    tried = [server[("dspark:spec_decode_num_verified_tokens_per_pos_total", str(p))] for p in range(block)]
    measured = [round(a / t, 4) for a, t in zip(accepted, tried, strict=True) if t]
    assert measured and watched["window"]["position_acceptance"] == pytest.approx(measured, abs=1e-4)

    profile = json.loads(_cli("profile", "--model", model, "--gpu", "h100", "--workload", "code", "--from-monitor",
                              "--json", env=env).stdout)
    assert profile["accept"]["per_head"]["markov"] == measured
    assert profile["accept"]["source"].startswith(f"measured: monitor deployment {watched['deployment_id']} ")
    from profiler.schema import Profile
    from tuner.acceptance import acceptance_for

    tuner_input = acceptance_for(Profile.model_validate(profile), "markov")  # what the simulator draws from
    assert tuner_input.alphas(len(measured)) == pytest.approx([min(0.999, m) for m in measured], abs=1e-4)
    bundle = tmp_path / "out"
    _cli("tune", "--gpu", "h100", "--trials", "3", "--out", str(bundle), "--json", env=env)  # re-profiles for h100
    prov = json.loads((bundle / "provenance.json").read_text())
    pred = prov["predicted_acceptance"]
    if pred is not None:  # the exported trial speculates: it assumed the measured acceptance
        assert "monitor deployment" in pred["source"]
        if pred["head"] == "markov":
            n = min(len(measured), pred["gamma"])
            assert pred["position_acceptance"][:n] == pytest.approx([min(0.999, m) for m in measured[:n]], abs=1e-4)
    assert f"monitor deployment {watched['deployment_id']}" in (bundle / "report.md").read_text()

    png = tmp_path / "watch.png"
    _cli("monitor", "report", "--out", str(png), env=env)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = _cli("monitor", "report", "--out", str(png), env=env, check=False)
    assert again.returncode == 2 and "--force" in again.stderr
    _cli("monitor", "report", env=env)  # by default beside the database, never into the current folder
    assert (tmp_path / "monitor" / f"monitor_{watched['deployment_id']}.png").read_bytes()[:4] == b"\x89PNG"
    listed = json.loads(_cli("monitor", "list", "--json", env=env).stdout)
    assert listed[0]["deployment_id"] == watched["deployment_id"] and listed[0]["samples"] == watched["samples"]


@pytest.mark.parametrize(("args", "says"), [
    (["monitor"], "give --url"),
    (["monitor", "--url", "http://127.0.0.1:9", "--samples", "1"], "cannot scrape"),
    (["monitor", "report"], "no deployment has been monitored"),
    (["monitor", "report", "--deployment", "x"], "give a number"),
    (["profile", "--model", "tiny", "--from-monitor"], "no deployment has been monitored"),
])
def test_monitor_bad_usage_is_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    import os

    env = dict(os.environ, DSPARK_DB=f"sqlite:///{tmp_path / 'kb.sqlite'}")
    r = _cli(*args, env=env, check=False)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
