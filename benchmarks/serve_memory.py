"""Does `serve` hold on to memory? A server gets 500 mixed requests (completions and chat, streamed and not, greedy
and sampled, stop strings, disconnects mid-stream and mid-generation, bad bodies, oversized prompts, hostile
seeds and temperatures, 429s past the queue) from concurrent clients; its resident set size (RSS, /proc) is
read after the first 50 and after all 500, each once the server is idle again. Issue 36 asks the second to stay
within 10% of the first.

    python benchmarks/serve_memory.py [--requests 500] [--warm 50] [--clients 8] [--write]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_md import shown_command, write_section  # noqa: E402


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` in MiB (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def one(server, i: int, rng: random.Random) -> str:  # noqa: ANN001 - tests.serving.Server
    """Request i of the mix; returns its kind and status."""
    kind = rng.choice(["plain", "stream", "chat", "chat_stream", "sampled", "stop", "bad", "long_prompt",
                       "hostile", "disconnect", "drop_plain"])
    base = {"prompt": f"def f{i}(x):\n    return", "max_tokens": rng.randint(4, 48), "temperature": 0}
    if kind == "sampled":
        base |= {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": rng.randint(0, 2**63 - 1)}
    elif kind == "stop":
        base |= {"stop": ["\n", "return"]}
    elif kind == "bad":
        body = b'{"prompt": "x", "frobnicate": 1}'
        return f"{kind}:{server.post('/completions', body)[0]}"
    elif kind == "long_prompt":
        base["prompt"] = "word " * 3000
    elif kind == "hostile":
        base |= rng.choice([{"seed": 2**64, "temperature": 0.5}, {"temperature": 1e-40}, {"prompt": "\ud800"}])
        body = json.dumps(base).encode()
        return f"{kind}:{server.post('/completions', body)[0]}"
    if kind in ("disconnect", "drop_plain"):
        body = json.dumps(base | {"max_tokens": 200, "ignore_eos": True, "stream": kind == "disconnect"}).encode()
        port = int(server.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(rng.uniform(0.05, 0.3))
        return f"{kind}:closed"
    if kind.startswith("chat"):
        body = {"messages": [{"role": "user", "content": base.pop("prompt")}], **base}
        body["stream"] = kind == "chat_stream"
        path = "/chat/completions"
    else:
        body, path = base | {"stream": kind == "stream"}, "/completions"
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            return f"{kind}:{r.status}"
    except urllib.error.HTTPError as e:
        e.read()
        return f"{kind}:{e.code}"


def drive(server, start: int, n: int, clients: int, seed: int) -> dict[str, int]:  # noqa: ANN001
    """n requests from `clients` threads; counts by kind:status."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    todo = iter(range(start, start + n))

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            got = one(server, i, rng)
            with lock:
                counts[got] = counts.get(got, 0) + 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def idle_rss(server) -> float:  # noqa: ANN001
    """RSS once the engine has no running or waiting request (aborted ones included)."""
    from tests.serving import scrape

    for _ in range(200):
        m = scrape(server)
        if m[("vllm:num_requests_running", "")] == 0 and m[("vllm:num_requests_waiting", "")] == 0:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    return rss_mib(server.proc.pid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--warm", type=int, default=50, help="requests before the first reading")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write the section into benchmarks/RESULTS.md")
    a = ap.parse_args()

    import torch

    from dspark_core.config import EngineConfig, save_config
    from tests.serving import Server

    tmp = Path(tempfile.mkdtemp(prefix="serve-memory-"))
    cfg = EngineConfig(device="cpu")
    cfg.batch.max_requests = 4
    cfg.model.max_seq_len = 512
    server = Server(save_config(cfg, tmp / "dspark.yaml"), "--max-waiting", "4")
    try:
        start_rss = idle_rss(server)
        t0 = time.perf_counter()
        first = drive(server, 0, a.warm, a.clients, a.seed)
        warm_rss = idle_rss(server)
        rest = drive(server, a.warm, a.requests - a.warm, a.clients, a.seed + 1)
        end_rss = idle_rss(server)
        wall = time.perf_counter() - t0
        with urllib.request.urlopen(server.base + "/health", timeout=10) as r:
            healthy = r.status == 200
    finally:
        code = server.stop()
    kinds: dict[str, int] = {}
    for counts in (first, rest):
        for k, v in counts.items():
            kinds[k] = kinds.get(k, 0) + v
    growth = end_rss / warm_rss - 1
    result = {"cpu": torch.backends.cpu.get_cpu_capability(), "requests": a.requests, "warm": a.warm,
              "clients": a.clients, "rss_start_mib": round(start_rss, 1), "rss_after_warm_mib": round(warm_rss, 1),
              "rss_after_all_mib": round(end_rss, 1), "growth": round(growth, 4), "pass": growth <= 0.10,
              "healthy_after": healthy, "exit_code": code, "seconds": round(wall, 1),
              "outcomes": dict(sorted(kinds.items()))}
    print(json.dumps(result, indent=1))
    if a.write:
        rows = " ".join(f"`{k}` {v}," for k, v in result["outcomes"].items()).rstrip(",")
        text = (f"## `serve` memory under 500 mixed requests (issue 36, {time.strftime('%Y-%m-%d')})\n\n"
                f"`{shown_command('benchmarks/serve_memory.py')}` (tiny target, 4 slots, 4 queued, {a.clients} "
                f"concurrent clients; CPU capability {result['cpu']}).\n\n"
                f"| RSS at start | after the first {a.warm} | after all {a.requests} | growth | within 10% |\n"
                "|---:|---:|---:|---:|---|\n"
                f"| {start_rss:.0f} MiB | {warm_rss:.0f} MiB | {end_rss:.0f} MiB | {growth:+.1%} | "
                f"{'yes' if result['pass'] else 'NO'} |\n\n"
                f"/health 200 afterwards: {healthy}; SIGTERM exit code {code}; {wall:.0f} s. Outcomes (kind:status): "
                f"{rows}.")
        write_section("serve_memory", text)


if __name__ == "__main__":
    main()
