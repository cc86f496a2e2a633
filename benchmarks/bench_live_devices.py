"""Live tuning on device groups (issue 40): the same study run one server at a time and on `--devices`, side by
side in one run, and (`--isolate`) what busy neighbours cost one configuration's measurement.

For each engine: `tune --engine E --trials N --confirm 0` through the real entry point, first with one server at a
time, then with `--devices D` (one server per device group, side by side), each on a fresh copy of a knowledge base
that holds the tiny target's CPU profile. Reported: each run's wall time (the command, and the trials' span from the
first start to the last end) and the ratio parallel / serial.
- `dspark`: our `serve` on the tiny target. On a CPU its "devices" are fake: every server computes on the same
  cores (each gets cores / devices threads), so this measures the scheduler and the CPU's contention together.
- `fake`: tests/live/fake_tune.py's server, whose time per generated token is a sleep ($FAKE_TOKEN_S): a device
  that works while the host waits, as a GPU does. This measures what the scheduler itself achieves.

`--isolate`: the parallel study's best configuration measured alone on a fresh server, then again while every other
device group runs the same configuration under the same load; the ratio is what a neighbour costs a measurement.

    python benchmarks/bench_live_devices.py --trials 16 --devices 0-3 --isolate --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_md import shown_command, write_section  # noqa: E402
from tuner.live.report import most_at_once  # noqa: E402

ENTRY = {"dspark": ROOT / "cli.py", "fake": ROOT / "tests" / "live" / "fake_tune.py"}
LOAD = ["--concurrency", "2", "--trial-requests", "6", "--trial-max-tokens", "16"]


def _env(work: Path, db: Path) -> dict[str, str]:
    return {**os.environ, "DSPARK_DB": f"sqlite:///{db}", "DSPARK_STATE_DIR": str(work / "state"),
            "FAKE_ENGINE_STATE": str(work / "fake-starts"), "FAKE_TOKEN_S": os.environ.get("FAKE_TOKEN_S", "0.02"),
            "DSPARK_ENGINE_PLUGINS": "tests.live.fake_tune"}


def run(engine: str, work: Path, kb: Path, trials: int, devices: str | None, tag: str) -> dict:
    """One study; its wall time, the trials' span, and how many ran at once at most."""
    import optuna

    db = work / f"{tag}.sqlite"
    shutil.copyfile(kb, db)
    argv = [sys.executable, str(ENTRY[engine]), "tune", "--engine", engine, "--trials", str(trials), "--confirm",
            "0", "--study", tag, "--out", str(work / tag), "--json", *LOAD]
    argv += ["--devices", devices] if devices else []
    t0 = time.time()
    r = subprocess.run(argv, cwd=ROOT, env=_env(work, db), capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode not in (0, 2):
        sys.exit(f"bench_live_devices: {tag} failed:\n{r.stderr[-3000:]}")
    done = [t for t in optuna.load_study(study_name=tag, storage=f"sqlite:///{db}").trials
            if t.state.name == "COMPLETE"]
    start = min(t.datetime_start for t in done)
    span = (max(t.datetime_complete for t in done) - start).total_seconds()
    most = most_at_once(done)
    best = max((t for t in done if t.values and t.user_attrs.get("feasible")), key=lambda t: t.values[0],
               default=None)
    print(f"{engine} {tag}: {len(done)} trials, {wall:.1f} s (trials {span:.1f} s), up to {most} at once",
          file=sys.stderr, flush=True)
    return {"wall_s": wall, "span_s": span, "trials": len(done), "at_once": most, "db": str(db),
            "best": best.number if best else None}


def trial_point(db: str, study: str, trial: int):  # -> (StudySpec, params)
    """Study `study`'s settings and trial `trial`'s configuration, as its server runs it."""
    import optuna

    from tuner import study as st

    s = optuna.load_study(study_name=study, storage=db)
    spec = st.StudySpec.model_validate(s.user_attrs[st.SPEC_ATTR])
    return spec, spec.space().params_of(dict(s.trials[trial].params))


def neighbour(db: str, study: str, trial: int, seconds: float) -> None:
    """(a subprocess) Measure trial `trial`'s configuration over and over on a group of its own for `seconds`."""
    from tuner.live.evaluator import LiveEvaluator

    spec, params = trial_point(db, study, trial)
    ev = LiveEvaluator(spec)
    try:
        end = time.time() + seconds
        i = 0
        while time.time() < end:
            ev.remeasure(params, seed=1000 + i)
            i += 1
    finally:
        ev.close()


def isolate(engine: str, work: Path, par: dict, devices: str) -> dict:
    """The best configuration alone, then beside busy neighbours on every other group (throughput, tok/s)."""
    from tuner.live.devices import DEVICES_ENV, parse_devices
    from tuner.live.evaluator import LiveEvaluator

    env = _env(work, Path(par["db"]))
    os.environ.update({k: env[k] for k in ("DSPARK_DB", "DSPARK_STATE_DIR", "FAKE_ENGINE_STATE", "FAKE_TOKEN_S")})
    os.environ[DEVICES_ENV] = devices
    if engine == "fake":
        import tests.live.fake_tune  # noqa: F401 - registers the engine
    url = f"sqlite:///{par['db']}"
    spec, params = trial_point(url, "parallel", par["best"])
    ev = LiveEvaluator(spec)
    out: dict = {"alone": [], "beside": []}
    try:
        for rep in range(2):
            out["alone"].append(ev.remeasure(params, seed=rep).metrics.get("throughput", 0.0))
            ev.stop()
            n = len(parse_devices(devices)) - 1
            procs = [subprocess.Popen([sys.executable, __file__, "--neighbour", url, "parallel", str(par["best"]),
                                       "60"], cwd=ROOT, env={**env, DEVICES_ENV: devices},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
            time.sleep(8)  # the neighbours started and under load
            out["beside"].append(ev.remeasure(params, seed=rep).metrics.get("throughput", 0.0))
            ev.stop()
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
    finally:
        ev.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="dspark,fake")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--devices", default="0-3")
    ap.add_argument("--isolate", action="store_true")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--neighbour", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.neighbour:
        neighbour(a.neighbour[0], a.neighbour[1], int(a.neighbour[2]), float(a.neighbour[3]))
        return 0
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    work = Path(tempfile.mkdtemp(prefix="bench-devices-"))
    kb = work / "kb.sqlite"
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "profile", "--model", "tiny", "--json"], cwd=ROOT,
                       env={**os.environ, "DSPARK_DB": f"sqlite:///{kb}"}, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr[-2000:])
    rows, iso = [], {}
    for engine in a.engines.split(","):
        ser = run(engine, work, kb, a.trials, None, "serial")
        par = run(engine, work, kb, a.trials, a.devices, "parallel")
        rows.append((engine, ser, par))
        if a.isolate and par["best"] is not None:
            iso[engine] = isolate(engine, work, par, a.devices)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"## Live tuning on device groups (issue 40, {when})", "",
             f"`{shown_command('benchmarks/bench_live_devices.py')}` on a CPU with capability **{cap}** "
             f"({os.cpu_count()} cores, {platform.processor() or platform.machine()}): {a.trials} trials of "
             f"`tune --engine E --confirm 0` ({' '.join(LOAD)}) one server at a time, then with `--devices "
             f"{a.devices}` (one server per group, side by side), on the tiny target's profile. `fake`: a server whose "
             f"time per token is a sleep of {os.environ.get('FAKE_TOKEN_S', '0.02')} s (a device that works while the "
             "host waits); `dspark`: our serve, computing on this CPU's cores.", "",
             "| engine | serial: wall s | trials s | --devices: wall s | trials s | at once | trials ratio "
             "| wall ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for engine, ser, par in rows:
        lines.append(f"| {engine} | {ser['wall_s']:.1f} | {ser['span_s']:.1f} | {par['wall_s']:.1f} | "
                     f"{par['span_s']:.1f} | {par['at_once']} | {par['span_s'] / ser['span_s']:.2f} | "
                     f"{par['wall_s'] / ser['wall_s']:.2f} |")
    if iso:
        lines += ["", "`--isolate`: the parallel study's best configuration, tok/s measured alone and beside busy "
                  "neighbours (every other group serving it under the same load), two rounds:", ""]
        for engine, got in iso.items():
            alone, beside = got["alone"], got["beside"]
            ratio = (sum(beside) / len(beside)) / (sum(alone) / len(alone)) if sum(alone) else float("nan")
            lines.append(f"- {engine}: alone {', '.join(f'{x:.1f}' for x in alone)}; beside "
                         f"{', '.join(f'{x:.1f}' for x in beside)}; beside / alone {ratio:.2f}")
    text = "\n".join(lines)
    print(text)
    print(json.dumps({"rows": rows, "isolate": iso}, default=str), file=sys.stderr)
    if a.write:
        write_section("live_devices", text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
