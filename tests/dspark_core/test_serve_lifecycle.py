"""`serve`'s life under failure: a request that breaks an engine step fails alone and the loop goes on; SIGTERM past
the grace period ends every in-flight request with an error (503 / an error event and [DONE]) and exits; a
non-streaming client that disconnects is aborted while it generates, and the gauges fall back to 0 at once;
slow-header clients (slowloris) cannot exhaust the descriptors; unsafe start-up combinations are refused or warned.
Through the real `serve` process, except the injected engine failure (an in-process server with a patched step)."""

from __future__ import annotations

import json
import resource
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import cli
from dspark_core.config import EngineConfig, save_config
from tests.serving import Server, scrape, serve_config


def _long_config(tmp: Path) -> Path:
    cfg = EngineConfig(device="cpu")
    cfg.batch.max_requests = 4
    cfg.model.max_seq_len = 2048
    return save_config(cfg, tmp / "dspark.yaml")


def _port(s: Server) -> int:
    return int(s.base.rsplit(":", 1)[1])


def _request_head(body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.fixture(scope="module")
def long_server(tmp_path_factory) -> Iterator[Server]:
    """A server whose requests can run for seconds (2,048-token context); the SIGTERM test ends it."""
    s = Server(_long_config(tmp_path_factory.mktemp("long")), "--grace", "1", "--static")
    yield s
    if s.proc.poll() is None:
        s.stop()


def test_a_disconnected_non_streaming_request_is_aborted_and_the_gauges_follow(long_server: Server) -> None:
    s = long_server
    body = json.dumps({"prompt": "x", "max_tokens": 1900, "ignore_eos": True, "temperature": 0}).encode()
    sock = socket.create_connection(("127.0.0.1", _port(s)))
    sock.sendall(_request_head(body))
    for _ in range(100):  # it generates
        if scrape(s)[("vllm:num_requests_running", "")] == 1:
            break
        time.sleep(0.05)
    sock.close()
    for _ in range(100):
        m = scrape(s)
        if m.get(("vllm:request_success_total", "abort")) == 1:
            break
        time.sleep(0.05)
    assert m[("vllm:request_success_total", "abort")] == 1
    assert m[("vllm:generation_tokens_total", "")] < 1900  # stopped, not run to max_tokens
    assert m[("vllm:num_requests_running", "")] == 0  # no step follows on the idle engine: the gauge still fell
    assert m[("vllm:num_requests_waiting", "")] == 0


def test_sigterm_past_the_grace_ends_each_request_with_an_error_and_exits(long_server: Server) -> None:
    s = long_server
    results: dict[str, object] = {}

    def plain(i: int) -> None:
        results[f"plain{i}"] = s.post("/completions", json.dumps({"prompt": "x", "max_tokens": 1900,
                                                                   "ignore_eos": True, "temperature": 0}).encode())

    def stream(i: int) -> None:
        body = json.dumps({"prompt": "y", "max_tokens": 1900, "ignore_eos": True, "temperature": 0,
                           "stream": True}).encode()
        req = urllib.request.Request(s.url + "/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            results[f"stream{i}"] = [ln.decode().strip() for ln in r if ln.strip()]

    threads = [threading.Thread(target=f, args=(i,)) for i in range(2) for f in (plain, stream)]
    for t in threads:
        t.start()
    for _ in range(100):
        if scrape(s)[("vllm:num_requests_running", "")] == 4:
            break
        time.sleep(0.05)
    t0 = time.perf_counter()
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert s.proc.wait(30) == 0
    assert time.perf_counter() - t0 < 15  # 1 s of grace, then the requests end: no minutes of generating
    err = s.proc.stderr.read()
    assert "Traceback" not in err and "CancelledError" not in err, err
    assert "4 requests did not finish within --grace 1 s" in err
    for i in range(2):
        code, body = results[f"plain{i}"]
        assert code == 503 and "shutting down" in body["error"]["message"]
        lines = results[f"stream{i}"]
        assert lines[-1] == "data: [DONE]"
        last = json.loads(lines[-2].removeprefix("data: "))
        assert "shutting down" in last["error"]["message"]
        assert any('"text"' in ln for ln in lines[:-2])  # it had streamed tokens before the deadline


def test_slow_header_clients_cannot_exhaust_the_descriptors(tmp_path: Path) -> None:
    """600 connections that never finish their headers, against a server with 768 descriptors (a cap of 256
    connections): past the cap new ones are closed at once, the rest after --timeout-header, and a normal request
    is served meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (768, 768))

    s = Server(serve_config(tmp_path), "--host", "0.0.0.0", "--timeout-header", "1", preexec_fn=few_descriptors)
    socks: list[socket.socket] = []
    try:
        assert any("without an API key" in ln for ln in s.preamble)  # a non-loopback bind without a key warns
        for _ in range(600):
            c = socket.create_connection(("127.0.0.1", _port(s)), timeout=5)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
            socks.append(c)
        # a client that retries a reset connection (as HTTP clients and balancers do) is served once the header
        # deadline has freed slots: within seconds, not minutes
        t0 = time.perf_counter()
        while True:
            try:
                code, r = s.post("/completions", b'{"prompt": "x", "max_tokens": 2, "temperature": 0}')
                break
            except (ConnectionResetError, urllib.error.URLError):  # URLError wraps a reset during connect
                assert time.perf_counter() - t0 < 5, "no slot freed within 5 s of the header deadline (1 s)"
                time.sleep(0.1)
        assert code == 200 and time.perf_counter() - t0 < 5
        time.sleep(2.0)  # past the header deadline
        closed = 0
        for c in socks:
            c.settimeout(0.01)
            try:
                closed += c.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
        assert closed == len(socks)
        code, r = s.post("/completions", b'{"prompt": "x", "max_tokens": 2, "temperature": 0}')
        assert code == 200
    finally:
        for c in socks:
            c.close()
        assert s.stop() == 0
    assert "Too many open files" not in s.proc.stderr.read()


def test_reconfigurable_without_a_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSPARK_API_KEY", raising=False)
    assert cli.main(["serve", "--config", str(serve_config(tmp_path)), "--reconfigurable"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--reconfigurable" in err and "--api-key" in err


# -- a failing engine step, injected into an in-process server -----------------------------------------------------
class _InProcess:
    """build_app on a given engine behind uvicorn in a thread (the patched engine cannot cross a process)."""

    def __init__(self, engine) -> None:  # noqa: ANN001 - dspark_core.engine.Engine
        import uvicorn

        from dspark_core.serving.app import ServeOptions, build_app

        self.app = build_app(engine, ServeOptions(model_name="target", adaptive=False))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="critical"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return
            time.sleep(0.05)
        raise AssertionError("in-process server did not start")

    def post(self, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def health(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=10) as r:
                return r.status, json.loads(r.read())["status"]
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["status"]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def failing_server() -> Iterator[_InProcess]:
    """One slot; a step with a request of seed 666 raises, as an engine bug would."""
    from dspark_core.engine import Engine

    cfg = EngineConfig(device="cpu")
    cfg.batch.max_requests = 1
    cfg.model.max_seq_len = 256
    engine = Engine(cfg)
    real = engine._round

    def round_that_breaks(running, admit):  # noqa: ANN001, ANN202
        if any(r.sp.seed == 666 for r in running):
            raise RuntimeError("injected failure")
        return real(running, admit)

    engine._round = round_that_breaks  # type: ignore[method-assign]
    s = _InProcess(engine)
    yield s
    s.stop()


def test_a_request_that_breaks_a_step_fails_alone(failing_server: _InProcess) -> None:
    s = failing_server
    got: dict[str, tuple[int, dict]] = {}
    bad = threading.Thread(target=lambda: got.update(bad=s.post({"prompt": "x", "seed": 666, "temperature": 0.5,
                                                                 "max_tokens": 20})))
    good = threading.Thread(target=lambda: got.update(good=s.post({"prompt": "y", "temperature": 0,
                                                                   "max_tokens": 20})))
    bad.start()
    time.sleep(0.05)
    good.start()  # queued behind the bad one (one slot): it must be served after the failed step
    bad.join(60)
    good.join(60)
    code, r = got["bad"]
    assert code == 500 and "failed inside the engine" in r["error"]["message"]
    assert "injected failure" in r["error"]["message"] and "cmpl-" in r["error"]["message"]
    assert got["good"][0] == 200 and got["good"][1]["usage"]["completion_tokens"] == 20
    assert s.health() == (200, "ok")
    with urllib.request.urlopen(s.base + "/metrics", timeout=10) as m:
        assert 'vllm:request_success_total{engine="0",finished_reason="error",model_name="target"} 1.0' in \
            m.read().decode()


def test_an_engine_that_keeps_failing_reports_unhealthy_then_recovers(failing_server: _InProcess) -> None:
    s = failing_server
    for _ in range(3):
        assert s.post({"prompt": "x", "seed": 666, "temperature": 0.5, "max_tokens": 5})[0] == 500
    code, status = s.health()
    assert code == 503 and "engine steps failed" in status
    assert s.post({"prompt": "y", "temperature": 0, "max_tokens": 5})[0] == 200
    assert s.health() == (200, "ok")
