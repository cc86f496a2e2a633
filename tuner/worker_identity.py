"""Who runs a trial: host, kernel boot, PID namespace, PID and the process's start time, stored on the trial.

Optuna notices a killed worker by its heartbeat only after the grace period (15 s by default), and a trial killed
before its first beat never goes stale. A tuner resumed within that window used to count the dead trial as running
and stop one trial short. With the identity on the trial, any process on the same machine can tell at once
whether the worker is gone: no process with that PID, or one started at another time (the PID was reused).
A trial of another machine, or of another PID namespace (a container), is left to the heartbeat.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from typing import Any

ATTR = "dspark_worker"  # trial system attribute holding the identity
RUNNING_HERE: set[int] = set()  # trial ids this process is running now (tuner/trial_run.py keeps it)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """The start time of live process `pid` in clock ticks after boot (/proc/PID/stat field 22); None when there is
    no such process, it is a zombie (dead, not yet reaped) or /proc cannot tell."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and parentheses
    try:
        state, start = fields[0], int(fields[19])  # fields 3 and 22 overall
    except (IndexError, ValueError):
        return None
    return None if state in ("Z", "X", "x") else start


@cache
def _machine() -> dict[str, str | None]:
    """What makes two processes' PIDs comparable: the same host, kernel boot and PID namespace."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "pidns": pidns}


def current() -> dict[str, Any]:
    """This process's identity (stored on each trial it runs)."""
    pid = os.getpid()
    return {**_machine(), "pid": pid, "start": start_ticks(pid)}


def gone(identity: Any, trial_id: int) -> bool:
    """Whether the worker `identity` names is certainly gone for trial `trial_id`: it ran on this machine, in this
    PID namespace, and no process with its PID and start time lives now (or it is this process, which is not
    running that trial any more). False whenever this process cannot tell (another machine, a container, no
    /proc)."""
    if not isinstance(identity, dict):
        return False
    here = _machine()
    if here["boot"] is None or here["pidns"] is None:
        return False  # no /proc: cannot compare
    if any(identity.get(k) != here[k] for k in ("host", "boot", "pidns")):
        return False
    pid, start = identity.get("pid"), identity.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    now = start_ticks(pid)
    if now is None:
        return True
    if start is not None and now != start:
        return True  # the PID now belongs to another process
    return pid == os.getpid() and trial_id not in RUNNING_HERE
