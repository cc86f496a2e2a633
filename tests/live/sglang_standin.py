"""A stand-in for `python -m sglang.launch_server` on a machine without a GPU: `python -m tests.live.sglang_standin
ARGS` (tests/live/sglang_python.py writes the interpreter that routes SGLang's launch here).

It parses the command line the live trial's sglang.sh built with SGLang's own parser (`prepare_server_args` of
SGLang 0.5.23, with `--device cuda` added: SGLang resolves GPU settings only for a GPU) and resolves it
(`ServerArgs.resolve_once`, where SGLang's model-config imports are installed); a flag SGLang refuses ends the
start-up as SGLang would (exit 2 and its usage error), so the trial fails with its reason. Then it serves the
model SGLang was given with our engine (`cli.py serve`, plain decoding, one thread) behind a proxy on SGLang's host
and port that passes every request through and renames the /metrics series to SGLang's (live/scrape.py's table),
so the live tuner drives and reads it exactly as a SGLang server. It checks that its visible-devices variables
agree (the tuner gives each server its group in both), and prints what SGLang read on its first line.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("DSPARK_SGLANG_PKGS"):  # SGLang's parser, after this venv's own packages (not shadowing them)
    sys.path.append(os.environ["DSPARK_SGLANG_PKGS"])


def parse(argv: list[str]) -> dict:
    """SGLang's own reading of `argv` (SystemExit 2 with its message when it refuses a flag)."""
    from sglang.srt.server_args import prepare_server_args

    if "--device" not in argv:
        argv = [*argv, "--device", "cuda"]
    sa = prepare_server_args(argv)
    try:
        sa.resolve_once()
        d, how = sa.resolved_dict(), "resolved"
    except ModuleNotFoundError as e:  # resolution imports SGLang's model configs (torchvision...): parsed only
        d, how = vars(sa), f"parsed (not resolved: no {e.name} here)"
    keys = ("model_path", "host", "port", "tp_size", "dp_size", "max_running_requests", "speculative_algorithm",
            "speculative_num_steps", "speculative_num_draft_tokens", "api_key", "mem_fraction_static",
            "attention_backend")
    return {"sglang": how} | {k: d.get(k, getattr(sa, k, None)) for k in keys}


def renamed(text: str) -> str:
    """Our /metrics (vLLM's series names) under SGLang's names, series by series (live/scrape.py's table)."""
    from live.scrape import NAMES

    pairs = sorted(((NAMES["vllm"][k], NAMES["sglang"][k]) for k in NAMES["vllm"] if k in NAMES["sglang"]),
                   key=lambda p: -len(p[0]))
    out = []
    for line in text.splitlines():
        for ours, theirs in pairs:
            if ours in line:
                out.append(line.replace(ours, theirs))
                break
        else:
            if "vllm:" not in line and "dspark:" not in line:  # SGLang has no such series: left out
                out.append(line)
    return "\n".join(out) + "\n"


def proxy(host: str, port: int, upstream: int) -> ThreadingHTTPServer:
    """Every request passed to our serve on 127.0.0.1:`upstream`, streamed back as it comes."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_a) -> None:  # quiet
            pass

        def _pass(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            conn.request(method, self.path, body=body, headers=headers)
            r = conn.getresponse()
            if self.path.startswith("/metrics"):
                data = renamed(r.read().decode()).encode()
                self.send_response(r.status)
                self.send_header("Content-Type", r.getheader("Content-Type") or "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := r.read1(65536):
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            conn.close()

        def do_GET(self) -> None:
            self._pass("GET")

        def do_POST(self) -> None:
            self._pass("POST")

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str]) -> int:
    cuda, hip = os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("HIP_VISIBLE_DEVICES")
    if cuda is not None and hip is not None and cuda != hip:
        print(f"error: CUDA_VISIBLE_DEVICES={cuda} and HIP_VISIBLE_DEVICES={hip} disagree", file=sys.stderr)
        return 2
    got = parse(argv)  # SystemExit 2 on a refused flag, as `python -m sglang.launch_server` exits
    print("sglang-standin: SGLang read " + json.dumps(got, default=str), flush=True)
    import tempfile

    from dspark_core.config import EngineConfig, save_config
    from tuner.live.process import free_port

    inner = free_port()
    cfg = EngineConfig(device="cpu")
    cfg.model.path, cfg.spec.enabled = str(got["model_path"]), False
    cfg.batch.max_requests = min(64, int(got["max_running_requests"] or 8))
    config = save_config(cfg, Path(tempfile.mkdtemp(prefix="sglang-standin-")) / "dspark.yaml")
    serve = [sys.executable, str(ROOT / "cli.py"), "serve", "--config", str(config), "--host", "127.0.0.1",
             "--port", str(inner), "--threads", "1"]
    env = {k: v for k, v in os.environ.items() if k not in ("DSPARK_API_KEY", "DSPARK_SGLANG_PKGS")}
    child = subprocess.Popen(serve, cwd=ROOT, env=env)
    signal.signal(signal.SIGTERM, lambda *_: (child.terminate(), sys.exit(0)))
    deadline = time.time() + 300
    while True:  # SGLang answers /health only once its model is loaded: so does the stand-in
        if child.poll() is not None:
            return child.returncode or 1
        try:
            conn = http.client.HTTPConnection("127.0.0.1", inner, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            child.kill()
            return 1
        time.sleep(0.2)
    try:
        proxy(str(got.get("host") or "127.0.0.1"), int(got["port"]), inner).serve_forever()
    finally:
        child.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
