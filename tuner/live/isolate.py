"""`tune --engine E --devices D --isolate`: what busy neighbours cost a measurement on this machine.

Trials on `--devices` run side by side, and on one machine their servers share more than devices: the host's
cores, memory bandwidth, PCIe and (on a CPU) everything. So after the study and its confirmations, the exported
configuration is measured on a fresh server alone (this machine leased exclusively: no other server of any study
runs, see tuner/live/devices.py), then again while every other device group of `--devices` serves the same
configuration under the same load (neighbour processes, `python -m tuner.live.isolate`), `ROUNDS` times in turn.
beside / alone is what neighbours cost; the report and `--json` show it, and the study keeps it (user attribute
`isolation`), so a resumed study does not measure it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tuner.errors import TunerError

ISOLATION_ATTR = "isolation"  # study user attribute: {trial, alone: [tok/s], beside: [tok/s], neighbours, ratio}
ROUNDS = 2  # alone / beside pairs


def neighbours_of(devices: list[int], need: int) -> int:
    """How many neighbour servers fit beside one server of `need` devices."""
    return len(devices) // max(1, need) - 1


def check_isolate(devices: list[int] | None, engine: str | None) -> None:
    """`--isolate` needs a live engine and room for a neighbour (one line, exit 2, before any trial runs)."""
    if engine is None:
        raise TunerError("--isolate measures a live engine's servers side by side: add --engine and --devices")
    if devices is None or len(devices) < 2:
        raise TunerError("--isolate runs the best configuration beside busy neighbours: give --devices with two "
                         "or more devices, e.g. --devices 0-3")


def isolation(study, spec, db_url: str, on_step=None) -> dict[str, Any] | None:  # noqa: ANN001 - optuna, StudySpec
    """Measure the exported trial alone and beside neighbours (or return the stored result for it); None when no
    trial meets the SLOs. `on_step(done, total)` after each measurement."""
    from tuner.live.devices import from_env, group_size
    from tuner.live.evaluator import LiveEvaluator
    from tuner.study import best_trial
    from tuner.targets import replicas

    trial = best_trial(study, spec)
    if trial is None:
        return None
    stored = study.user_attrs.get(ISOLATION_ATTR)
    if stored and stored.get("trial") == trial.number:
        return stored
    devices = from_env() or []
    params = spec.space().params_of(dict(trial.params))
    need = group_size(int(params.get("parallel.tp", 1)), replicas(spec.profile_model(), params))
    n = neighbours_of(devices, need)
    if n < 1:
        return {"trial": trial.number, "skipped": f"its server needs {need} of the {len(devices)} devices: no "
                                                  "group is left for a neighbour"}
    ev = LiveEvaluator(spec)
    alone: list[float] = []
    beside: list[float] = []
    try:
        for r in range(ROUNDS):  # a run that fails is said, not raised: the study's bundle is still exported
            ev.alone = True
            alone.append(_throughput(ev, params, r))
            if on_step:
                on_step(2 * r + 1, 2 * ROUNDS)
            ev.alone = False
            with neighbours(db_url, study.study_name, trial.number, n,
                            ready_s=spec.startup_seconds + 3 * spec.trial_seconds):
                beside.append(_throughput(ev, params, r))
            if on_step:
                on_step(2 * r + 2, 2 * ROUNDS)
    except TunerError as e:
        return {"trial": trial.number, "skipped": str(e)}  # not stored: a resumed study tries again
    finally:
        ev.close()
    ratio = statistics.mean(beside) / statistics.mean(alone) if statistics.mean(alone) > 0 else None
    got = {"trial": trial.number, "alone": alone, "beside": beside, "neighbours": n,
           "ratio": round(ratio, 4) if ratio is not None else None}
    study.set_user_attr(ISOLATION_ATTR, got)
    return got


def isolation_text(iso: dict) -> str:
    """The check in one line (the summary, report.md, the benchmark): the trial alone and beside neighbours."""
    if iso.get("skipped"):
        return f"--isolate: trial {iso['trial']} not checked: {iso['skipped']}"
    alone = ", ".join(f"{x:,.1f}" for x in iso["alone"])
    beside = ", ".join(f"{x:,.1f}" for x in iso["beside"])
    ratio = f"{iso['ratio']:.2f}" if iso.get("ratio") is not None else "-"
    return (f"--isolate: trial {iso['trial']} alone {alone} tok/s, beside {iso['neighbours']} busy neighbour(s) "
            f"{beside} tok/s: beside / alone {ratio}")


def _throughput(ev, params: dict[str, Any], seed: int) -> float:  # noqa: ANN001 - LiveEvaluator
    r = ev.remeasure(params, seed=seed)
    ev.stop()
    if not r.feasible:
        raise TunerError(f"the exported configuration failed to measure ({r.why}) though its trial passed: this "
                         "machine may be short of memory beside its neighbours")
    return round(float(r.metrics.get("throughput", 0.0)), 3)


@contextmanager
def neighbours(db_url: str, study: str, trial: int, n: int, ready_s: float):  # noqa: ANN201
    """`n` neighbour processes, each serving trial `trial`'s configuration under load on a device group of its own;
    yields once every one is under load (each has started its server and measured once; a neighbour not there after
    `ready_s` fails the check), stops them on the way out."""
    from tuner.live.process import die_with_parent

    folder = Path(tempfile.mkdtemp(prefix="isolate-"))
    procs = []
    for i in range(n):
        with open(folder / f"log-{i}", "w") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, "-m", "tuner.live.isolate", db_url, study, str(trial),
                                           str(folder / f"ready-{i}")], preexec_fn=die_with_parent,
                                          stdout=subprocess.DEVNULL, stderr=log))
    try:
        end = time.monotonic() + ready_s
        while not all((folder / f"ready-{i}").exists() for i in range(n)):
            dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                log = _tail(folder / f"log-{dead[0][0]}")
                raise TunerError(f"a neighbour server stopped (exit {dead[0][1]}): {log or 'no output'}")
            if time.monotonic() > end:
                raise TunerError(f"the neighbours were not serving after {ready_s:.0f} s")
            time.sleep(0.2)
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        for i in range(n):  # the files this check wrote, by name; the folder goes only if nothing else is in it
            (folder / f"ready-{i}").unlink(missing_ok=True)
            (folder / f"log-{i}").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _tail(path: Path, limit: int = 4096) -> str:
    """The end of a neighbour's log (its last `limit` bytes read, at most 400 characters kept)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
        return f.read().decode(errors="replace").strip()[-400:]


def neighbour(db_url: str, study_name: str, trial: int, ready: Path) -> None:
    """(a neighbour process) Serve trial `trial`'s configuration on a group of its own, under the trial's load,
    until stopped; `ready` is written once its server is measured and loaded."""
    import optuna

    from tuner import study as st
    from tuner.live.evaluator import LiveEvaluator
    from tuner.worker import _interrupt

    signal.signal(signal.SIGTERM, _interrupt)  # stopped by the check: its server is stopped on the way out
    study = optuna.load_study(study_name=study_name, storage=st.storage(db_url))
    spec = st.StudySpec.model_validate(study.user_attrs[st.SPEC_ATTR])
    params = spec.space().params_of(dict(study.trials[trial].params))
    ev = LiveEvaluator(spec)
    try:
        first = ev.evaluate(params, seed=1000)
        if not first.feasible:
            raise TunerError(f"the neighbour's server failed: {first.why}")
        ready.write_text(str(os.getpid()))
        i = 0
        while True:
            ev.load(seed=1001 + i)
            i += 1
    except KeyboardInterrupt:
        pass
    finally:
        ev.close()


if __name__ == "__main__":
    try:
        neighbour(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
