"""A stand-in OpenAI-compatible server for the live tuner's fault tests: `python fake_server.py PORT MODE`.

MODE: ok (serves), fail (prints an OOM and exits 1), hang (never listens), die (healthy, then exits on the first
completion request). It streams `max_tokens` one-character chunks with usage, as vLLM and our serve do.
$FAKE_SERVER_LOG: a file where each server appends a JSON line when it starts serving and when it is stopped (its
visible devices and the time), so a test can see which servers ran at once.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(port: int, mode: str) -> None:
    if mode == "fail":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if mode == "hang":
        print("loading weights...", flush=True)
        while True:
            time.sleep(1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_a) -> None:  # quiet
            pass

        def _json(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json({})
            elif self.path == "/v1/models":
                self._json({"data": [{"id": "fake"}]})
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            if mode == "die":
                os._exit(3)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            n = int(body.get("max_tokens", 4))
            for _ in range(n):
                time.sleep(float(os.environ.get("FAKE_TOKEN_S", "0.002")))  # the device's time per token
                self.wfile.write(b'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n')
            end = {"choices": [{"text": "", "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": n}}
            self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    _log("start")
    signal.signal(signal.SIGTERM, lambda *_: (_log("stop"), os._exit(0)))
    server.serve_forever()


def _log(event: str) -> None:
    path = os.environ.get("FAKE_SERVER_LOG")
    if path:
        line = json.dumps({"pid": os.getpid(), "event": event, "t": time.time(),
                           "devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
        with open(path, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
