"""The devices a live study may use on this machine (`tune --engine ... --devices SPEC`), and leases on groups of
them, so that several servers run side by side without sharing a device.

A lease is an exclusive `flock` on one file per device under state_dir()/devices: the kernel drops it when the
process that holds it dies (kill -9 included), so a crashed worker or tuner never leaves a device marked busy,
and two tuner processes on one machine, or two workers of one tuner, never get the same device. A trial takes a
whole group at once or nothing (no worker holds some devices while it waits for more, so no two wait on each
other); groups are aligned to their size where they can be (TP 2 on devices 0,1 or 2,3: the pairs a node's
topology links best).

A measurement that must run alone on this machine (a finalist's confirmation, the `--isolate` check's "alone" run)
takes the machine exclusively: every lease also holds a shared `flock` on state_dir()/devices/node.lock, an
exclusive lease holds it exclusively, and a gate file in front of it keeps new leases out while an exclusive one
waits for the running servers to finish (so it is not starved by studies that keep starting trials).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError

DEVICES_ENV = "DSPARK_TUNE_DEVICES"  # the tuner's --devices, as the worker processes it starts read them
VISIBLE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")  # what a server is told it may use
MAX_DEVICES = 256
POLL_S = 0.2  # how often a worker waiting for a group looks again


def parse_devices(spec: str) -> list[int]:
    """`0-7`, `0,1,2,3`, `0-3,6` or `auto` (every device this machine shows) as a sorted list of device ids."""
    text = spec.strip().lower()
    if text == "auto":
        found = visible_devices()
        if not found:
            raise TunerError("--devices auto: this machine shows no GPU (no CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, "
                             "nvidia-smi or rocm-smi); name them, e.g. --devices 0-3")
        return found
    if not re.fullmatch(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*", text):
        raise TunerError(f"--devices {spec!r}: give device ids as 0-7, 0,1,2,3 or auto")
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise TunerError(f"--devices {spec!r}: the range {part} runs backwards; write {b}-{a}")
        if b - a + 1 + len(out) > MAX_DEVICES:
            raise TunerError(f"--devices {spec!r}: more than {MAX_DEVICES} devices")
        out.update(range(a, b + 1))
    return sorted(out)


def visible_devices() -> list[int]:
    """The devices this process may use: the visible-devices variable when set (its positions: the ids a child
    then sees), else those nvidia-smi or rocm-smi list."""
    for var in VISIBLE:
        value = os.environ.get(var)
        if value is not None:
            return list(range(len([v for v in value.split(",") if v.strip()])))
    for tool, pattern in (("nvidia-smi", r"^GPU \d+:"), ("rocm-smi", r"^GPU\[\d+\]")):
        if shutil.which(tool) is None:
            continue
        args = ["-L"] if tool == "nvidia-smi" else ["--showid"]
        try:
            out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        ids = {ln.split(":")[0] for ln in out.splitlines() if re.match(pattern, ln.strip())}
        if ids:
            return list(range(len(ids)))
    return []


def from_env() -> list[int] | None:
    """The tuner's --devices in a worker process (None: the study runs one server at a time, on what it sees)."""
    value = os.environ.get(DEVICES_ENV)
    return parse_devices(value) if value else None


def group_size(tp: int, replicas: int) -> int:
    """Devices a trial's server uses: TP x data-parallel replicas."""
    return max(1, tp) * max(1, replicas)


@dataclass
class Lease:
    """Devices held for one server; `env` is what the server is started with."""

    devices: tuple[int, ...]
    _files: list = field(default_factory=list, repr=False)  # the open, locked files (closing them frees the devices)

    @property
    def env(self) -> dict[str, str]:
        ids = ",".join(str(d) for d in self.devices)
        return dict.fromkeys(VISIBLE, ids)

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()


def locks_dir() -> Path:
    from tuner.live.process import state_dir

    return state_dir() / "devices"


def _candidates(devices: list[int], n: int) -> list[tuple[int, ...]]:
    """Groups of `n` to try, best first: aligned runs of consecutive ids, then any consecutive run."""
    runs = [tuple(devices[i:i + n]) for i in range(0, len(devices) - n + 1)
            if devices[i + n - 1] - devices[i] == n - 1]
    aligned = [r for r in runs if r[0] % n == 0]
    return aligned + [r for r in runs if r not in aligned]


def _node(exclusive: bool) -> list | None:
    """This machine's hold for one lease (see the module docstring): the files locked ([node], or [gate, node] for
    an exclusive lease), or None when it must wait: an exclusive lease holds or waits at the gate, and for an
    exclusive one a server still runs (it keeps the gate meanwhile, so no new one starts)."""
    folder = locks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    if exclusive and _waiting_at_gate:
        gate = _waiting_at_gate.pop()
    else:
        gate = open(folder / "gate.lock", "a+")  # noqa: SIM115 - held (exclusive) or let go below
        try:
            fcntl.flock(gate, mode | fcntl.LOCK_NB)
        except OSError:
            gate.close()
            return None
    node = open(folder / "node.lock", "a+")  # noqa: SIM115 - held while the lease lives
    try:
        fcntl.flock(node, mode | fcntl.LOCK_NB)
    except OSError:
        node.close()
        if exclusive:
            _waiting_at_gate.append(gate)
        else:
            gate.close()
        return None
    if exclusive:
        return [gate, node]
    gate.close()  # a shared lease passes the gate and leaves it
    return [node]


_waiting_at_gate: list = []  # an exclusive lease's gate file, held while it waits for the running servers


def exclusive_waiting() -> bool:
    """Whether an exclusive lease waits on this machine (a worker then stops its running server between trials
    instead of keeping it for the next)."""
    folder = locks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "gate.lock", "a+") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return not _waiting_at_gate  # our own waiting exclusive lease is no reason to stop
        return False


def try_lease(devices: list[int], n: int, exclusive: bool = False) -> Lease | None:
    """`n` of `devices` locked for this process, or None when fewer than `n` are free now: every free device is
    locked for a moment, the best group of them kept (an aligned run, else a run, else any) and the rest let go.
    `exclusive`: no other lease on this machine while this one lives (a failed exclusive try keeps its place at
    the gate until `lease` returns)."""
    node = _node(exclusive)
    if node is None:
        return None
    folder = locks_dir()
    free: dict[int, object] = {}
    try:
        for d in devices:
            f = open(folder / f"{d}.lock", "a+")  # noqa: SIM115 - held open while the lease lives
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            free[d] = f
        if len(free) < n:
            return None
        ids = sorted(free)
        group = next((g for g in _candidates(ids, n)), tuple(ids[:n]))
        got, node = Lease(group, [*node, *(free.pop(d) for d in group)]), []
        return got
    finally:
        if exclusive and node:  # not leased: an exclusive waiter keeps its place at the gate
            _waiting_at_gate.append(node.pop(0))
        for f in [*free.values(), *node]:
            f.close()  # type: ignore[attr-defined]


def lease(devices: list[int], n: int, say: bool = True, exclusive: bool = False) -> Lease:
    """Block until `n` of `devices` are free, then hold them (TunerError when `devices` has fewer than `n`);
    `exclusive`: and until no other server runs on this machine, and hold it so.

    Waiters are served first come, first served (a ticket file per waiter, oldest first; a dead waiter's ticket is
    skipped): a trial that needs four devices is not starved by one-device trials that keep taking the next free
    one."""
    if n > len(devices):
        raise TunerError(f"the trial's server needs {n} devices (TP x replicas) and --devices gives "
                         f"{len(devices)}")
    ticket = _ticket(devices)
    said = False
    try:
        while True:
            if _first(ticket):
                got = try_lease(devices, n, exclusive)
                if got is not None:
                    return got
            if say and not said:
                print("waiting for the other servers on this machine to stop (this measurement runs alone)"
                      if exclusive else f"waiting for {n} free device(s) of {','.join(map(str, devices))}",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(POLL_S * (0.5 + random.random()))
    finally:
        ticket.unlink(missing_ok=True)
        for f in _waiting_at_gate:
            f.close()
        _waiting_at_gate.clear()


def _ticket(devices: list[int]) -> Path:
    """This waiter's place in the queue of `devices` (a tuner with other devices has its own): a file named by the
    time it came and its process (pid and start time)."""
    from tuner.live.process import _start_ticks

    folder = locks_dir() / "queue" / "-".join(map(str, devices))[:200]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.time_ns():020d}-{os.getpid()}-{_start_ticks(os.getpid())}-{random.randrange(1 << 30)}"
    path.touch()
    return path


TICKET = re.compile(r"\d{20}-(\d+)-(\d+|None)-\d+")  # _ticket's names: time, pid, its start ticks, a nonce


def _first(ticket: Path) -> bool:
    """Whether every waiter ahead of `ticket` is gone (their process ended: their ticket is removed here; a file
    not named as a ticket is no waiter, and not ours to remove)."""
    from tuner.live.process import _alive

    for other in sorted(ticket.parent.iterdir()):
        if other.name >= ticket.name:
            return True
        m = TICKET.fullmatch(other.name)
        if m is None:
            continue
        if _alive(int(m[1]), None if m[2] == "None" else int(m[2])):
            return False
        other.unlink(missing_ok=True)
    return True


def seen_by(pid: int) -> dict[str, str]:
    """The visible-devices variables of process `pid` and of every process of its group (its engine's workers):
    name -> value, one value per name when they agree, else the values joined by ' | '."""
    pids = [pid]
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and p.name != str(pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pid:  # its process group
                    pids.append(int(p.name))
    out: dict[str, set[str]] = {}
    for p in pids:
        with contextlib.suppress(OSError):
            for item in (Path(f"/proc/{p}") / "environ").read_bytes().split(b"\0"):
                name, _, value = item.decode(errors="replace").partition("=")
                if name in VISIBLE:
                    out.setdefault(name, set()).add(value)
    return {k: " | ".join(sorted(v)) for k, v in out.items()}
