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

`--isolate`: `tune --isolate` on the parallel study: its best configuration measured alone on a fresh server, then
again while every other device group runs the same configuration under the same load; the ratio is what a neighbour
costs a measurement.

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
from tuner.live.isolate import isolation_text  # noqa: E402
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


def isolate(engine: str, work: Path, devices: str) -> dict:
    """`tune --isolate` on the finished parallel study (it resumes with its trials done and its stored settings):
    the best configuration alone, then beside busy neighbours on every other group (tuner/live/isolate.py)."""
    argv = [sys.executable, str(ENTRY[engine]), "tune", "--engine", engine, "--trials", "1", "--confirm", "0",
            "--study", "parallel", "--out", str(work / "isolate"), "--json", "--devices", devices, "--isolate"]
    r = subprocess.run(argv, cwd=ROOT, env=_env(work, work / "parallel.sqlite"), capture_output=True, text=True)
    if r.returncode not in (0, 2) or not r.stdout.strip():
        sys.exit(f"bench_live_devices: --isolate failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)["isolation"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="dspark,fake")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--devices", default="0-3")
    ap.add_argument("--isolate", action="store_true")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
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
        mine = work / engine  # each engine's databases, bundles and state apart (a database file is never reused)
        mine.mkdir()
        ser = run(engine, mine, kb, a.trials, None, "serial")
        par = run(engine, mine, kb, a.trials, a.devices, "parallel")
        rows.append((engine, ser, par))
        if a.isolate and par["best"] is not None:
            iso[engine] = isolate(engine, mine, a.devices)
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
        lines += ["", "`tune --isolate` on the parallel study: its best configuration, tok/s measured alone (this "
                  "machine leased exclusively) and beside busy neighbours (every other group serving it under the "
                  "same load), two rounds:", ""]
        for engine, got in iso.items():
            lines.append(f"- {engine}: {isolation_text(got)}")
    text = "\n".join(lines)
    print(text)
    print(json.dumps({"rows": rows, "isolate": iso}, default=str), file=sys.stderr)
    if a.write:
        write_section("live_devices", text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
