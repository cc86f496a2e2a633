"""The engine's step on the thread that loaded the model against the same step on a second thread (why `serve` runs
the engine on one thread: dspark_core/serving/driver.py).

With libgomp (torch's OpenMP on Linux) each thread that runs a parallel op keeps its own team of OpenMP workers;
once the teams outnumber the cores, idle workers sleep instead of spinning and every parallel op waits for a wake-up.
Each child process loads SmolLM2-135M on its main thread and times the lean model's bf16 step (8 requests x 1 token
over 250 cached positions, median of 20): `main` steps on that thread, `second` on a new one. Children alternate
(main, second, main, ...), and the figure is the ratio of their medians (the cores are shared).

    python benchmarks/thread_step.py [--threads 2] [--rows 8] [--pairs 3] [--json]

Needs `python cli.py models fetch smollm2-135m`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(where: str, threads: int, rows: int) -> float:
    """Median seconds of the step, run on the loading thread (`main`) or on a second thread (`second`)."""
    import torch

    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.cpu_linear import pack_linears

    torch.set_num_threads(threads)
    model = load_model(str(checkpoint_folder("smollm2-135m")), "cpu", "bf16")
    pack_linears(model)
    cache = model.new_cache(rows, 512)
    tokens = torch.randint(0, 1000, (rows, 1))
    out: list[float] = []

    def steps() -> None:
        for i in range(23):
            cache.lens[:] = 250
            t0 = time.perf_counter()
            model(tokens, cache, list(range(rows)), [1] * rows)
            if i >= 3:
                out.append(time.perf_counter() - t0)

    from dspark_core.pystack import on_deep_stack  # both threads: no data-stack chunk churn per step

    if where == "main":
        on_deep_stack(steps)
    else:
        t = threading.Thread(target=on_deep_stack, args=(steps,))
        t.start()
        t.join()
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--rows", type=int, default=8, help="requests in the step")
    ap.add_argument("--pairs", type=int, default=3, help="alternating (main, second) child pairs")
    ap.add_argument("--child", choices=("main", "second"), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.child:
        print(child(a.child, a.threads, a.rows))
        return 0
    import torch

    times: dict[str, list[float]] = {"main": [], "second": []}
    for _ in range(a.pairs):
        for where in times:
            cmd = [sys.executable, __file__, "--child", where, "--threads", str(a.threads), "--rows", str(a.rows)]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if p.returncode:
                sys.exit(f"child {where} failed: {p.stderr.strip().splitlines()[-1:]}")
            times[where].append(float(p.stdout.split()[-1]))
    m, o = statistics.median(times["main"]), statistics.median(times["second"])
    cap = torch.backends.cpu.get_cpu_capability()
    res = {"cpu_capability": cap, "threads": a.threads, "rows": a.rows,
           "loading_thread_ms": [round(1e3 * x, 2) for x in times["main"]],
           "second_thread_ms": [round(1e3 * x, 2) for x in times["second"]], "ratio": round(o / m, 3)}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{cap}, {a.threads} threads, {a.rows} rows: step on the loading thread {1e3 * m:.2f} ms, on a "
              f"second thread {1e3 * o:.2f} ms ({res['ratio']}x; per child {res['loading_thread_ms']} vs "
              f"{res['second_thread_ms']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
