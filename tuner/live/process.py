"""Server processes a live study starts: launched in their own process group, recorded in a pidfile, and always
stopped, even when the tuner is killed.

Every server runs in a new session (its own process group, so the engine's worker processes stop with it) and
gets SIGTERM when the tuner that started it dies (Linux PR_SET_PDEATHSIG). Its pidfile names the server and the
tuner that owns it; `reap_orphans`, called before any live study runs, stops the process group of every server
whose owner is gone (a tuner killed with -9 before the kernel signal could help, a machine that rebooted), so
resuming a killed study never leaves a server behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL


def state_dir() -> Path:
    """Where pidfiles live: $DSPARK_STATE_DIR, else $XDG_STATE_HOME/dspark-tune, else ~/.local/state/dspark-tune."""
    if os.environ.get("DSPARK_STATE_DIR"):
        return Path(os.environ["DSPARK_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dspark-tune"


def servers_dir() -> Path:
    return state_dir() / "servers"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): a pid reused by another
    process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])  # a zombie has exited


def _alive(pid: int, ticks: int | None) -> bool:
    now = _start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Launch:
    """How to start one server: the command, its environment additions, where it runs."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    port: int
    health_path: str = "/health"
    files: dict[str, str] = field(default_factory=dict)  # name -> content of the launch files (restart key)
    identity: str | None = None  # the configuration as the engine sees it (None: the files and flags decide)
    hot: tuple[str, ...] = ()  # of that, the parameters a running server takes without a restart

    def key(self) -> str:
        """Two launches with the same key start the same server: a trial may reuse a running one."""
        import hashlib

        if self.identity is not None:
            return hashlib.sha256(self.identity.encode()).hexdigest()
        body = json.dumps([self.argv[2:] if len(self.argv) > 2 else self.argv, self.env, self.files], sort_keys=True)
        return hashlib.sha256(body.replace(str(self.port), "PORT").replace(str(self.cwd), "DIR").encode()).hexdigest()

    def restart_key(self) -> str:
        """Two launches with the same restart key differ only in hot settings: a running server of one becomes
        the other's by a reconfiguration (LiveEngine.reconfigure) instead of a restart."""
        import hashlib

        if self.identity is None or not self.hot:
            return self.key()
        cold = {k: v for k, v in json.loads(self.identity).items() if k not in self.hot}
        return hashlib.sha256(json.dumps(cold, sort_keys=True, default=str).encode()).hexdigest()


class ServerFailed(Exception):
    """A server that did not become healthy or died while in use; `kind` is what the study stores."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind  # startup_failed | startup_timeout | died | devices
        self.why = why


class Server:
    """One running server of a live trial."""

    def __init__(self, launch: Launch, log: Path, env_extra: dict[str, str] | None = None) -> None:
        self.launch = launch
        self.log_path = log
        self.url = f"http://127.0.0.1:{launch.port}"
        env = {**os.environ, **launch.env, **(env_extra or {})}  # env_extra: its devices (not part of its key)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=die_with_parent)
        self.started = time.time()
        self.pidfile = servers_dir() / f"{self.proc.pid}.json"
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.write_text(json.dumps({
            "pid": self.proc.pid, "ticks": _start_ticks(self.proc.pid), "owner": os.getpid(),
            "owner_ticks": _start_ticks(os.getpid()), "argv": launch.argv, "log": str(log), "started": self.started}))

    def tail(self, lines: int = 3) -> str:
        """The last lines of the server's log, on one line (what a failed start says about itself)."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [ln.strip() for ln in text if ln.strip() and not ln.lstrip().startswith(("File ", "^", "~"))]
        return " | ".join(useful[-lines:])[-400:]

    def reason(self) -> str:
        """Why a failed server failed: the first error line of its log (the root cause; engines print the
        same error again as it unwinds through their processes), else its last lines."""
        import re

        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        pat = re.compile(r"(\b\w*(Error|Exception)\b: .+|error: .+|out of memory.*)", re.IGNORECASE)
        for ln in text:
            m = pat.search(ln)
            if m and "warning" not in ln.lower():
                return classify(m.group(1).strip()[:400])
        return classify(self.tail())

    def exited(self, wait_s: float = 0.0) -> int | None:
        """The exit status, or None while it runs; `wait_s`: give a process that just stopped answering that long
        to finish exiting (a refused connection comes before the exit is reaped)."""
        if wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        return self.proc.poll()

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; ServerFailed when the process exits or the time runs out."""
        deadline = self.started + timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerFailed("startup_failed", f"the server exited with status {rc} before it was healthy: "
                                   f"{self.reason()}")
            try:
                with urllib.request.urlopen(self.url + self.launch.health_path, timeout=2) as r:
                    if r.status == 200:
                        return time.time() - self.started
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.time() >= deadline:
                raise ServerFailed("startup_timeout", f"the server was not healthy after {timeout_s:.0f} s "
                                   f"(--startup-seconds): {self.tail() or 'it printed nothing'}")
            time.sleep(0.25)

    def stop(self) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after STOP_GRACE_S; the pidfile goes once it is gone."""
        stop_group(self.proc.pid, _start_ticks(self.proc.pid))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_GRACE_S)
        self.pidfile.unlink(missing_ok=True)
        return self.proc.poll()


def classify(tail: str) -> str:
    """A start-up failure's log tail, prefixed with what it most likely was."""
    low = tail.lower()
    if "out of memory" in low or "outofmemory" in low or "cannot allocate" in low or "oom" in low.split():
        return f"out of memory: {tail}"
    if "unrecognized arguments" in low or "invalid choice" in low or "no such option" in low or \
            "error: argument" in low:
        return f"bad flag: {tail}"
    return tail or "it printed nothing"


def stop_group(pid: int, ticks: int | None) -> None:
    """Stop the process group led by `pid` (if that process is still the one started at `ticks`)."""
    now = _start_ticks(pid)
    if now is None:  # the leader is gone and its pid is free, so a group with that id can only be its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        return
    if ticks is not None and now != ticks:
        return  # the pid belongs to another process now (and the old group, which would have kept it, is gone)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.time() + STOP_GRACE_S
    while time.time() < deadline and _alive(pid, ticks):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def reap_orphans() -> list[int]:
    """Stop every recorded server whose owning tuner is gone; returns their pids."""
    folder = servers_dir()
    if not folder.is_dir():
        return []
    reaped = []
    for f in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(rec["owner"]), rec.get("owner_ticks")):
            continue  # its tuner still runs (another study): it stops its own servers
        stop_group(int(rec["pid"]), rec.get("ticks"))
        f.unlink(missing_ok=True)
        reaped.append(int(rec["pid"]))
    return reaped
