"""Studies under faults, through `python cli.py tune`: a full disk or a file size limit mid-study, a tuner killed
mid-trial and resumed at once, a PostgreSQL restart mid-study, and two tuners creating one study.

Each fault ends in one line (exit 2) and leaves the study consistent: completed trials kept, the failed trial
FAIL (or RUNNING with its dead worker's identity, failed by the next tune at once), and a resume with --trials N
ends at exactly N completed trials.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text

import cli
from kb.db import open_db
from tests.tuner.fixtures import PLAN, QWEN3_8B_H100
from tuner import study as st
from tuner.worker_identity import ATTR

ROOT = Path(__file__).resolve().parents[2]


def make_study(url: str, name: str, n_requests: int = 12) -> None:
    open_db(url)
    st.open_study(url, name, st.StudySpec(profile=QWEN3_8B_H100, plan=PLAN, n_requests=n_requests, slo_tpot_ms=50))


def states(url: str) -> Counter:
    """Trial states straight from the table (no Optuna storage: it would take SQLite's write lock to read), and
    under "identified" the running trials that already carry their worker's identity."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            out = Counter(conn.execute(text("select state from trials")).scalars())
            out["identified"] = conn.execute(text(
                "select count(*) from trials t join trial_system_attributes a on a.trial_id = t.trial_id "
                f"where t.state = 'RUNNING' and a.key = '{ATTR}'")).scalar_one()
            return out
    finally:
        engine.dispose()


def tune(url: str, name: str, trials: int, out: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "cli.py", "tune", "--study", name, "--trials", str(trials), "--db", url,
                             "--out", str(out), "--json"], cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


PROGRESS = re.compile(r"tuning: \d+/\d+ trials, (best \S+|no feasible trial yet)$")


def wait_for(url: str, proc: subprocess.Popen, done: int, running: bool = False, timeout: float = 120) -> Counter:
    """Poll until the study holds `done` completed trials (and one running, if asked)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            now = states(url)
        except Exception:  # tables not created yet
            now = Counter()
        if now["COMPLETE"] >= done and (not running or now["RUNNING"] == now["identified"] == 1):
            return now
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the study did not reach {done} completed trials in {timeout} s")


def one_error_line(err: str) -> str:
    """The fault's one `error:` line; `tune --json`'s per-trial progress lines before it are not errors."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not PROGRESS.match(ln)]
    assert "Traceback" not in err and "Should not reach" not in err and "UnboundLocalError" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    return lines[0]


def resume(url: str, name: str, trials: int, out: Path, capsys) -> int:
    """`tune --study NAME --trials N` in this process (the resume a user runs right after the fault)."""
    capsys.readouterr()
    code = cli.main(["tune", "--study", name, "--trials", str(trials), "--db", url, "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err[-3000:]
    return code


# --- a full disk, two ways --------------------------------------------------------------------------------------


def _fill(folder: Path) -> None:
    """Take every free byte of the file system `folder` is on. Unbuffered: a buffered file that met ENOSPC keeps
    the bytes it could not write and raises the same error again when it is closed."""
    with open(folder / "filler", "wb", buffering=0) as f:
        chunk = b"\0" * (1 << 16)
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root with CAP_SYS_ADMIN, as in CI's container; skipped elsewhere: `rlimit` covers it)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({(p.stderr or 'not root').strip()}); the RLIMIT_FSIZE "
                    "variant runs everywhere")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _limit_file_size(pid: int, db: Path) -> None:
    """The portable full disk: the tuner's files may not grow past their size now (writes then fail with EFBIG;
    Python ignores SIGXFSZ)."""
    size = max(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    try:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, size))
    except (OSError, AttributeError) as e:  # prlimit needs Linux and the same user
        pytest.skip(f"cannot set another process's RLIMIT_FSIZE here: {e}")


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_a_full_disk_mid_study_is_one_line_and_the_study_resumes(how, tmp_path, request):
    folder = request.getfixturevalue("small_disk") if how == "tmpfs" else tmp_path
    db = folder / "kb.sqlite"
    url = f"sqlite:///{db}"
    make_study(url, "s")
    proc = tune(url, "s", 500, tmp_path / "b")
    wait_for(url, proc, 1)
    _fill(folder) if how == "tmpfs" else _limit_file_size(proc.pid, db)
    _, err = proc.communicate(timeout=120)
    line = one_error_line(err)
    assert proc.returncode == 2 and line.startswith("error: study s: the database failed"), line  # in or between trials
    assert "resume with --study s" in line and ("full" in line or "disk" in line), line
    assert not (tmp_path / "b").exists()  # no bundle from a study cut short
    (folder / "filler").unlink(missing_ok=True)
    left = states(url)
    assert set(left) <= {"COMPLETE", "RUNNING", "FAIL", "WAITING", "identified"} and left["RUNNING"] <= 1, left
    target = left["COMPLETE"] + 1
    st.run(url, "s", target)  # resumed at once: the dead worker's trial is neither waited for nor counted
    after = states(url)
    assert after["COMPLETE"] == target and after["RUNNING"] == 0, after


# --- a tuner killed mid-trial ------------------------------------------------------------------------------------


def test_a_killed_tuners_trial_is_never_counted_by_an_immediate_resume(tmp_path, monkeypatch, capsys):
    """Resumed within the heartbeat's grace period, the dead trial used to count as running: the study stopped one
    short and exited 0. The trial's worker identity shows its process is gone, so it is failed at once."""
    monkeypatch.setenv("DSPARK_HEARTBEAT_GRACE_S", "600")  # the heartbeat cannot be what fails it
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    make_study(url, "k", n_requests=100)  # over half a second per trial: the kill lands inside one
    proc = tune(url, "k", 500, tmp_path / "b", DSPARK_HEARTBEAT_GRACE_S="600")
    before = wait_for(url, proc, 1, running=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = states(url)
    assert killed["RUNNING"] == 1, killed  # the scenario: one trial left running by a dead process
    target = killed["COMPLETE"] + 1
    assert target >= before["COMPLETE"] + 1
    resume(url, "k", target, tmp_path / "b", capsys)
    after = states(url)
    assert after["COMPLETE"] == target and after["RUNNING"] == 0 and after["FAIL"] >= 1, after


# --- a PostgreSQL restart ----------------------------------------------------------------------------------------


def _pg_data_dir(url: str) -> Path:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return Path(conn.execute(text("show data_directory")).scalar_one())
    finally:
        engine.dispose()


def _restart_postgres(data: Path) -> None:
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not bins or not data.is_dir():
        pytest.skip("the PostgreSQL server is not local (no pg_ctl or data directory here): cannot restart it")
    cmd = f"{bins[-1]} -D {data} -l {data}/log -m fast -w restart >/dev/null"
    subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c", cmd], check=True, timeout=60)


@pytest.fixture
def pg_url():
    """A new database on the CI PostgreSQL server (conftest's helper drops it with a connection the restart kills)."""
    import uuid

    from sqlalchemy.engine import make_url

    pg = os.environ.get("DSPARK_TEST_PG_URL")
    if not pg:
        if os.environ.get("CI"):
            pytest.fail("CI must export DSPARK_TEST_PG_URL (see .ci/run)")
        pytest.skip("no PostgreSQL here: set DSPARK_TEST_PG_URL (CI does)")
    name = f"dspark_test_{uuid.uuid4().hex[:10]}"

    def admin(sql: str) -> None:
        engine = create_engine(pg, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(sql))
        finally:
            engine.dispose()

    admin(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(pg).set(database=name).render_as_string(hide_password=False)
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_a_postgres_restart_mid_study_is_one_line_and_keeps_the_study(pg_url, tmp_path):
    url = pg_url
    make_study(url, "pg", n_requests=48)
    proc = tune(url, "pg", 6, tmp_path / "b")  # few: a run that rides the restart out ends soon too
    wait_for(url, proc, 2)
    _restart_postgres(_pg_data_dir(url))
    _, err = proc.communicate(timeout=180)
    if proc.returncode != 0:  # the restart hit a query: one line; else the next operation reconnected
        line = one_error_line(err)
        assert proc.returncode == 2 and line.startswith("error: study pg: the database failed"), line
        assert "check that the database server is up" in line, line
    else:
        assert "Traceback" not in err, err[-3000:]
    left = states(url)
    assert left["RUNNING"] == 0, left  # the failed trial was marked FAIL once the server was back
    st.run(url, "pg", left["COMPLETE"] + 1)  # and the study goes on (the CLI resume: the tests above)
    after = states(url)
    assert after["COMPLETE"] == left["COMPLETE"] + 1 and after["RUNNING"] == 0, after


# --- two tuners create one study ---------------------------------------------------------------------------------


def test_two_tuners_creating_one_sqlite_study_both_succeed(tmp_path, capsys):
    """Optuna creates its tables by checking, then creating: the other tuner's tables appear in between (emulated
    here at the exact moment; seen with two real processes on a new database) and the later CREATE TABLE failed
    with a SQLAlchemy traceback. The storage retries and joins what the other one made."""
    from optuna.storages._rdb import models

    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    assert cli.main(["profile", "--model", "qwen3", "--gpu", "h100", "--concurrency", "4", "--db", url]) == 0
    other = create_engine(url)

    raced: list[bool] = []

    def the_other_tuner_creates_them(*_a, **_k) -> None:
        models.BaseModel.metadata.create_all(other)
        raced.append(True)

    event.listen(models.StudyModel.__table__, "before_create", the_other_tuner_creates_them, once=True)
    try:
        code = cli.main(["tune", "--study", "dup", "--trials", "1", "--cost", "roofline", "--db", url, "--out",
                         str(tmp_path / "b"), "--json"])
    finally:
        if event.contains(models.StudyModel.__table__, "before_create", the_other_tuner_creates_them):
            event.remove(models.StudyModel.__table__, "before_create", the_other_tuner_creates_them)
        other.dispose()
    err = capsys.readouterr().err
    assert raced and code == 0 and "Traceback" not in err, err[-3000:]
    assert states(url)["COMPLETE"] == 1


def test_two_real_tuners_on_a_new_database_both_finish(tmp_path):
    """The same race between two real processes on a new database, where every shared first step can collide: the
    knowledge base's migration, the rule sync (read, then insert), Optuna's tables and the study itself."""
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    argv = [sys.executable, "cli.py", "tune", "--model", "qwen3", "--gpu", "h100", "--concurrency", "2", "--study",
            "same", "--trials", "1", "--cost", "roofline", "--db", url, "--json"]
    procs = [subprocess.Popen([*argv, "--out", str(tmp_path / f"b{i}")], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert states(url)["COMPLETE"] == 1
