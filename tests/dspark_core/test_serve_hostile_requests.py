"""`serve` against hostile requests, through the real entry point (a `serve` process): every case gets an
OpenAI-shaped error with a one-line message and the server answers the next request and /health.

Cases: sampling fields that used to kill the engine thread (seed 2**64, temperature 1e-40), out-of-range fields,
lone surrogates, oversized bodies (declared or chunked) and prompts, a chat template that loops, includes,
recurses, exhausts memory or renders megabytes (rendered in a child process with a deadline while /health answers),
the API key, and foreign Host / Origin headers (DNS rebinding, cross-site POSTs)."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from dspark_core.config import ASSETS, EngineConfig, save_config
from tests.serving import Server

KEY = "test-key-3f9a"
HOSTILE_TEMPLATE = (
    "{%- set c = messages[0]['content'] -%}"
    "{%- if c == 'loop' -%}{%- for i in range(100000) -%}{%- for j in range(100000) -%}{%- endfor -%}{%- endfor -%}"
    "{%- elif c == 'include' -%}{% include 'other.j2' %}"
    "{%- elif c == 'recurse' -%}{%- macro f(n) -%}{{ f(n + 1) }}{%- endmacro -%}{{ f(0) }}"
    "{%- elif c == 'bomb' -%}{{ 'a' * 4000000000 }}"
    "{%- elif c == 'big' -%}{%- for i in range(100000) -%}{{ 'x' * 1000 }}{%- endfor -%}"
    "{%- elif c == 'refuse' -%}{{ raise_exception('roles must alternate user/assistant') }}"
    "{%- else -%}{%- for m in messages -%}<{{ m['role'] }}>{{ m['content'] }}{%- endfor -%}<assistant>"
    "{%- endif -%}")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("hostile")
    tok = tmp / "tokenizer"
    tok.mkdir()
    shutil.copy(ASSETS / "target" / "tokenizer.json", tok / "tokenizer.json")
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                           "chat_template": HOSTILE_TEMPLATE}))
    cfg = EngineConfig(device="cpu")
    cfg.batch.max_requests = 4
    cfg.model.max_seq_len = 256
    cfg.model.tokenizer = str(tok)
    s = Server(save_config(cfg, tmp / "dspark.yaml"), "--static", "--reconfigurable", api_key=KEY)
    yield s
    assert s.stop() == 0


def _health(s: Server) -> int:
    with urllib.request.urlopen(s.base + "/health", timeout=5) as r:
        return r.status


def _alive(s: Server) -> None:
    """The server still serves: /health 200 and a greedy completion."""
    assert _health(s) == 200
    code, r = s.post("/completions", b'{"prompt": "def f(", "max_tokens": 3, "temperature": 0}')
    assert code == 200 and r["usage"]["completion_tokens"] == 3


def _one_line_error(code: int, body: dict, status: int, says: str) -> None:
    assert code == status, body
    msg = body["error"]["message"]
    assert says in msg and "\n" not in msg and "Traceback" not in msg, msg
    assert body["error"]["code"] == status and body["error"]["type"]


@pytest.mark.parametrize(("body", "says"), [
    ({"prompt": "x", "seed": 2**64, "temperature": 0.7}, "seed"),
    ({"prompt": "x", "seed": -(2**63) - 1, "temperature": 0.7}, "seed"),
    ({"prompt": "x", "temperature": 1e-40}, "temperature"),
    ({"prompt": "x", "temperature": 0.005}, "at least 0.01"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "top_k": 2**40}, "top_k"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"prompt": "x", "stop": ""}, "stop"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": [10**12]}, "prompt"),
    ({"prompt": [5, 70000]}, "[0, "),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "model": "m" * 300}, "model"),
    ({"prompt": "y" * 9000}, "characters"),
])
def test_out_of_range_fields_get_400_and_the_server_goes_on(server: Server, body: dict, says: str) -> None:
    code, r = server.post("/completions", json.dumps(body).encode())
    _one_line_error(code, r, 400, says)
    assert _health(server) == 200


def test_the_seeds_and_temperatures_that_killed_the_engine(server: Server) -> None:
    """The two requests of the report, then every later request is still served."""
    for body in ({"prompt": "x", "seed": 2**64, "temperature": 0.7}, {"prompt": "x", "temperature": 1e-40}):
        code, r = server.post("/completions", json.dumps(body).encode())
        assert code == 400, r
    code, r = server.post("/completions", json.dumps({"prompt": "x", "seed": 2**63 - 1, "temperature": 0.7,
                                                      "max_tokens": 4}).encode())
    assert code == 200 and r["usage"]["completion_tokens"] == 4
    _alive(server)


@pytest.mark.parametrize("raw", [b'{"prompt": "ab\\ud800cd"}',
                                 b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
                                 b'{"prompt": "x", "stop": ["\\ud800"]}'])
def test_a_lone_surrogate_is_400(server: Server, raw: bytes) -> None:
    path = "/chat/completions" if b"messages" in raw else "/completions"
    code, r = server.post(path, raw)
    _one_line_error(code, r, 400, "lone surrogate")
    _alive(server)


def _raw(server: Server, head: bytes, body_parts: list[bytes] = (), read_s: float = 10.0) -> bytes:
    port = int(server.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        sock.sendall(head)
        for part in body_parts:
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data) < 64:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        return data


def test_a_declared_huge_body_is_refused_before_it_is_read(server: Server) -> None:
    t0 = time.perf_counter()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 104857600\r\n\r\n")
    data = _raw(server, head)  # nothing of the 100 MB is sent
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert time.perf_counter() - t0 < 5
    _alive(server)


def test_a_chunked_body_past_the_cap_is_refused(server: Server) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * (1 << 20)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    data = _raw(server, head, [chunk] * 9)  # 9 MiB > the 8 MiB default
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    _alive(server)


def _chat(server: Server, content: str) -> tuple[int, dict]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0}
    return server.post("/chat/completions", json.dumps(body).encode())


def test_a_looping_chat_template_times_out_while_health_answers(server: Server) -> None:
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(r=_chat(server, "loop")))
    t0 = time.perf_counter()
    t.start()
    time.sleep(0.3)
    while t.is_alive():  # the event loop is free: /health answers at once during the render
        h0 = time.perf_counter()
        assert _health(server) == 200
        assert time.perf_counter() - h0 < 1.0
        time.sleep(0.3)
    t.join()
    code, r = got["r"]
    _one_line_error(code, r, 500, "took longer than")
    assert time.perf_counter() - t0 < 15
    _alive(server)


@pytest.mark.parametrize(("content", "status", "says"), [
    ("include", 500, "chat template"),
    ("recurse", 500, "recursed"),
    ("bomb", 500, "memory"),
    ("big", 500, "characters"),
    ("refuse", 400, "roles must alternate"),
])
def test_hostile_chat_templates_get_an_openai_error(server: Server, content: str, status: int, says: str) -> None:
    code, r = _chat(server, content)
    _one_line_error(code, r, status, says)
    code, r = _chat(server, "hello")  # the renderer was replaced or survived: a normal template renders
    assert code == 200, r
    _alive(server)


def test_the_api_key_guards_v1_and_admin_not_health_or_metrics(server: Server) -> None:
    def get(path: str, headers: dict[str, str]) -> int:
        try:
            with urllib.request.urlopen(urllib.request.Request(server.base + path, headers=headers), timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            assert body["error"]["code"] == e.code
            return e.code

    assert get("/v1/models", {}) == 401
    assert get("/v1/models", {"Authorization": "Bearer wrong"}) == 401
    assert get("/v1/models", server.headers()) == 200
    assert get("/health", {}) == 200 and get("/metrics", {}) == 200
    code, r = server.post("/completions", b'{"prompt": "x"}', headers={"Authorization": ""})
    _one_line_error(code, r, 401, "API key")
    code, r = server.post("//admin/spec", b'{"scheduler": "prefix"}', headers={"Authorization": ""})
    assert code == 401


@pytest.mark.parametrize(("headers", "says"), [
    ({"Host": "evil.example:8000"}, "not this server's address"),  # DNS rebinding: a name resolving to 127.0.0.1
    ({"Origin": "https://evil.example"}, "cross-site"),
    ({"Origin": "null"}, "cross-site"),
])
def test_foreign_host_and_origin_are_refused(server: Server, headers: dict[str, str], says: str) -> None:
    code, r = server.post("/completions", b'{"prompt": "x", "max_tokens": 1}', headers=headers)
    _one_line_error(code, r, 403, says)
    code, r = server.post("/completions", b'{"prompt": "x", "max_tokens": 1, "temperature": 0}',
                          headers={"Origin": server.base})  # the server's own origin is fine
    assert code == 200


def test_a_cross_site_text_plain_post_cannot_reconfigure(server: Server) -> None:
    """The CSRF of the report: a page's `text/plain` POST to /admin/spec (no preflight needed) is refused."""
    code, r = server.post("//admin/spec", b'{"scheduler": "prefix"}',
                          headers={"Content-Type": "text/plain", "Origin": "https://evil.example"})
    assert code == 403
    code, r = server.post("//admin/spec", b'{"scheduler": "prefix"}', headers={"Content-Type": "text/plain"})
    _one_line_error(code, r, 415, "application/json")  # only JSON: a browser cannot send it cross-site unasked
    code, r = server.post("//admin/spec", b'{"scheduler": "verify_all"}')
    assert code == 200 and r["spec"]["scheduler"] == "verify_all"
