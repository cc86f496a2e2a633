"""A stand-in OpenAI-compatible server for the live tuner's fault tests: `python fake_server.py PORT MODE`.

MODE: ok (serves), fail (prints an OOM and exits 1), hang (never listens), die (healthy, then exits on the first
completion request). It streams `max_tokens` one-character chunks with usage, as vLLM and our serve do.
"""

from __future__ import annotations

import json
import os
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

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
