"""Coverage-guided fuzzing of the project's file readers with atheris (libFuzzer), for a bounded time.

    python benchmarks/fuzz/run.py --target config_json --seconds 600

Convention for a target (one module per reader, `benchmarks/fuzz/target_<name>.py`; importable without atheris):
* `SEEDS: list[bytes]`: small valid inputs the mutations start from (real files where the project has them).
* `def fuzz_one(data: bytes) -> None`: runs the project's real reader on `data` (written to a temporary file with
  `scratch.write` when the reader takes a path) and swallows only the reader's deliberate one-line user errors
  (DSparkError, ProfileError, or the ValueError subclass the reader documents). Any other exception (and any
  assertion the target makes about what the reader accepted) propagates: that is a crash, a bug to fix.
* Optional `MAX_LEN: int` (largest input libFuzzer builds; default 4096; seeds must fit) and
  `DICTIONARY: list[bytes]` (tokens the mutator splices in: field names, magic numbers, limits).
* Every file in `crashes/<name>/` is replayed by tests/dspark_core/test_fuzz_regressions.py and must pass; keep a
  crash input there once its bug is fixed (rename it `<what-it-found>.bin`).

What this script does: seeds `corpus/<name>/` (gitignored) with SEEDS, then runs the target under atheris in a child
process with the project's packages instrumented (`atheris.instrument_imports(include=[dspark_core, profiler, kb])`:
only our readers give coverage feedback), `-max_total_time` the time left, `-timeout` per input, an RSS limit,
crashing / timing-out / out-of-memory inputs written to `crashes/<name>/` (libFuzzer's `slow-unit-*` reports, inputs
over 10 s by its wall clock, are listed apart: check them by replaying). A crash ends libFuzzer's run; the script
records it and starts a new child on the grown corpus until `--seconds` are spent. It prints and writes
`benchmarks/results/fuzz_<name>.json`: seconds, executions, coverage (`cov`), features (`ft`), corpus entries and
bytes as libFuzzer's last status line gives them, and the crash files found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\d+\w*)")
EXECUTED = re.compile(r"stat::number_of_executed_units: (\d+)")


def _paths() -> None:
    for p in (str(HERE), str(ROOT)):
        if p not in sys.path:
            sys.path.insert(0, p)


def child(name: str, args: list[str]) -> None:
    """Run target `name` under atheris with libFuzzer arguments `args` (this process ends when libFuzzer does)."""
    import atheris

    _paths()
    with atheris.instrument_imports(include=["dspark_core", "profiler", "kb"]):
        target = __import__(f"target_{name}")
    atheris.Setup([sys.argv[0], *args], target.fuzz_one)
    atheris.Fuzz()


def _seed(name: str, corpus: Path) -> dict:
    """Write the target's SEEDS into its corpus; its MAX_LEN and dictionary file."""
    _paths()
    target = __import__(f"target_{name}")
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in target.SEEDS:
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    info = {"max_len": getattr(target, "MAX_LEN", 4096), "dict": None}
    words = getattr(target, "DICTIONARY", None)
    if words:
        path = HERE / "logs" / f"{name}.dict"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join('"' + "".join(f"\\x{b:02x}" for b in w) + '"\n' for w in words))
        info["dict"] = str(path)
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="target name: benchmarks/fuzz/target_<name>.py")
    ap.add_argument("--seconds", type=int, default=600, help="total fuzzing time (restarts after crashes included)")
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take before it counts as a hang")
    ap.add_argument("--rss-mb", type=int, default=2048, help="memory limit of the fuzzing process")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a.target, a.child)
        return 0
    if not (HERE / f"target_{a.target}.py").is_file():
        ap.error(f"no benchmarks/fuzz/target_{a.target}.py")
    corpus, crashes = HERE / "corpus" / a.target, HERE / "crashes" / a.target
    crashes.mkdir(parents=True, exist_ok=True)
    info = _seed(a.target, corpus)
    before = {p.name for p in crashes.iterdir()}
    log_path = HERE / "logs" / f"{a.target}.log"
    log_path.parent.mkdir(exist_ok=True)
    start = time.monotonic()
    runs, executions, last, found, slow = 0, 0, None, [], []
    with open(log_path, "w") as log:
        while (left := a.seconds - int(time.monotonic() - start)) > 5:
            args = [str(corpus), f"-max_total_time={left}", f"-timeout={a.timeout}", f"-rss_limit_mb={a.rss_mb}",
                    f"-max_len={info['max_len']}", f"-artifact_prefix={crashes}/", "-print_final_stats=1"]
            if info["dict"]:
                args.append(f"-dict={info['dict']}")
            proc = subprocess.run([sys.executable, __file__, "--target", a.target, "--child", *args],
                                  capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONHASHSEED": "0"})
            runs += 1
            log.write(proc.stdout + proc.stderr)
            log.flush()
            statuses = [m.groups() for m in STATUS.finditer(proc.stderr)]
            last = statuses[-1] if statuses else last
            stat = EXECUTED.findall(proc.stderr)  # absent when a crash ended the child: its last status line
            executions += int(stat[-1]) if stat else int(statuses[-1][0]) if statuses else 0
            new = sorted({p.name for p in crashes.iterdir()} - before - set(found) - set(slow))
            slow += [n for n in new if n.startswith("slow-unit-")]  # a report, not a failure: the run goes on
            found += [n for n in new if not n.startswith("slow-unit-")]
            if proc.returncode != 0 and not new:
                print(proc.stderr[-3000:], file=sys.stderr)
                print(f"fuzz {a.target}: the child failed without writing a crash (exit {proc.returncode})",
                      file=sys.stderr)
                return 1
    seconds = round(time.monotonic() - start)
    import platform

    result = {
        "target": a.target, "seconds": seconds, "runs": runs, "executions": executions,
        "coverage": int(last[1]) if last else None, "features": int(last[2]) if last else None,
        "corpus_entries": int(last[3]) if last else None, "corpus_size": last[4] if last else None,
        "crashes": found, "slow_units": slow,
        "command": f"python benchmarks/fuzz/run.py --target {a.target} --seconds {a.seconds}",
        "python": platform.python_version(), "cpu_capability": _cpu_capability(),
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = ROOT / "benchmarks" / "results" / f"fuzz_{a.target}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _cpu_capability() -> str:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except ImportError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
