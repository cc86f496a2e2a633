"""How long the compiled engine takes to start on a cold disk cache: what `serve` does before its first request.

For each method: a fresh process builds the engine `serve` would (SmolLM2-135M, `--dtype`, `--max-requests` slots)
and compiles every step graph it meets (`warm_steps`) with an empty inductor cache (a temporary
`TORCHINDUCTOR_CACHE_DIR`), then again in a second fresh process on the cache the first one filled (a restart).
Reports each start's seconds, each graph's first call (compiling it) and the warm line. One method at a time.

    python benchmarks/compile_cold.py [--methods plain,dspark_markov/prefix] [--max-requests 8] [--dtype bf16]
        [--json]

Needs `python cli.py models fetch smollm2-135m`. A benchmark, not a test (minutes a method).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "benchmarks" / "configs" / "suffix_full_block.yaml"

CHILD = """
import json, sys, time, torch
sys.path.insert(0, {root!r})
from dspark_core.cli.bench import method_params
from dspark_core.cli.commands import _config
from dspark_core.config import apply_params
from dspark_core.engine import Engine
from dspark_core.engine_parts import warm_steps
torch.set_num_threads({threads})
cfg = _config({config!r}, "smollm2-135m", {dtype!r})
cfg = apply_params(cfg, method_params({method!r}, cfg))
cfg.compile, cfg.batch.max_requests = True, {rows}
t0 = time.perf_counter()
engine = Engine(cfg)
built = time.perf_counter() - t0
line = warm_steps(engine)
graphs = {{str(k): round(v, 1) for k, v in engine.target.compiled.seen.items()}}
print(f"{{built:.1f}}\\t{{time.perf_counter() - t0:.1f}}\\t{{json.dumps(graphs)}}\\t{{line}}")
"""


def start(method: str, a: argparse.Namespace, cache: str) -> dict[str, object]:
    """One fresh process: seconds to build the engine, seconds to build and warm it, the warm line."""
    code = CHILD.format(root=str(ROOT), threads=a.threads, config=str(CONFIG), dtype=a.dtype, method=method,
                        rows=a.max_requests)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{method}: the engine did not start:\n{proc.stderr[-2000:]}")
    built, total, graphs, line = proc.stdout.strip().splitlines()[-1].split("\t", 3)
    return {"build_s": float(built), "start_s": float(total), "graph_s": json.loads(graphs), "warm": line}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="plain,dspark_markov/prefix")
    ap.add_argument("--max-requests", type=int, default=8)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="results/compile_cold_<cap>.json and its RESULTS.md section")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_md import check_ranges

    check_ranges("compile_cold", (("--max-requests", a.max_requests, 1, 64), ("--threads", a.threads, 1, 256)))
    import torch

    rows = []
    for method in [m.strip() for m in a.methods.split(",") if m.strip()]:
        with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache:
            print(f"{method}: cold start ...", file=sys.stderr, flush=True)
            cold = start(method, a, cache)
            print(f"{method}: cold {cold['start_s']} s; restart ...", file=sys.stderr, flush=True)
            warm = start(method, a, cache)
        rows.append({"method": method, "cold": cold, "restart": warm})
        print(f"{method}: cold {cold['start_s']} s, restart {warm['start_s']} s: {cold['warm']}", file=sys.stderr)
    result = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": a.threads, "dtype": a.dtype,
              "max_requests": a.max_requests, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "rows": rows}
    print(json.dumps(result) if a.json else json.dumps(result, indent=1))
    if a.write:
        write(result)
    return 0


def write(r: dict[str, object]) -> None:
    from results_md import shown_command, write_section

    cap = str(r["capability"]).lower()
    lines = [f"## The compiled engine's start on a cold disk cache on {r['capability']} (issue 41, {r['when']})", "",
             f"`{shown_command('benchmarks/compile_cold.py')}` on a CPU with capability **{r['capability']}** "
             f"({r['threads']} threads, {r['dtype']}, {r['max_requests']} slots): a fresh process builds the engine "
             "`serve` would and compiles every step graph it meets with an empty inductor cache, then a second one "
             "restarts on the cache the first filled. Seconds; a graph's seconds are its first call's.", "",
             "| method | cold start s | of which building the engine | restart s | graphs | slowest graph s |",
             "|---|---:|---:|---:|---:|---:|"]
    for x in r["rows"]:  # type: ignore[union-attr]
        cold = x["cold"]
        lines.append(f"| {x['method']} | {cold['start_s']} | {cold['build_s']} | {x['restart']['start_s']} | "
                     f"{len(cold['graph_s'])} | {max(cold['graph_s'].values(), default=0)} |")
    write_section(f"compile_cold_{cap}", "\n".join(lines))
    (ROOT / "benchmarks" / "results" / f"compile_cold_{cap}.json").write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
