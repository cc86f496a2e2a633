"""A `serve` process through the real entry point, for the serving and live tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from dspark_core.config import EngineConfig, save_config

ROOT = Path(__file__).resolve().parents[1]


def serve_config(tmp: Path, max_requests: int = 4) -> Path:
    cfg = EngineConfig(device="cpu")
    cfg.batch.max_requests = max_requests
    cfg.model.max_seq_len = 256
    return save_config(cfg, tmp / "dspark.yaml")


class Server:
    def __init__(self, config: Path, *extra: str, api_key: str | None = None, env: dict[str, str] | None = None,
                 preexec_fn=None) -> None:  # noqa: ANN001
        self.api_key = api_key
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        env.pop("DSPARK_API_KEY", None)
        if api_key:
            env["DSPARK_API_KEY"] = api_key
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "serve", "--config", str(config),
                                      "--port", "0", "--threads", "1", *extra],
                                     stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                                     preexec_fn=preexec_fn)
        self.preamble: list[str] = []  # stderr lines before the "serving" line (warnings)
        line = self.proc.stderr.readline()
        while line and "serving" not in line and len(self.preamble) < 20:
            self.preamble.append(line)
            line = self.proc.stderr.readline()
        assert "serving" in line, "".join(self.preamble) + line + self.proc.stderr.read()
        self.url = line.strip().rsplit(" ", 1)[-1]  # http://127.0.0.1:PORT/v1

    @property
    def base(self) -> str:
        """http://127.0.0.1:PORT (without /v1)."""
        return self.url.removesuffix("/v1")

    def headers(self, **extra: str) -> dict[str, str]:
        return ({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}) | extra

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        """POST to /v1 + path (or the root when path starts with //); (status, JSON body)."""
        url = self.base + path[1:] if path.startswith("//") else self.url + path
        hdrs = self.headers(**{"Content-Type": "application/json"}) | (headers or {})
        req = urllib.request.Request(url, data=body, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    @property
    def client(self):  # noqa: ANN201 - openai.OpenAI
        import openai

        return openai.OpenAI(base_url=self.url, api_key=self.api_key or "none", max_retries=0)


def scrape(server: Server) -> dict[tuple[str, str], float]:
    """/metrics as {(sample name, its finished_reason / position / reason label): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.labels.get("finished_reason") or s.labels.get("position") or s.labels.get("reason") or ""
            out[(s.name, key)] = out.get((s.name, key), 0.0) + s.value
    return out
