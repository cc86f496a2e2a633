"""`serve` through the real entry point: the official openai client (streaming and not) gets generate's greedy
outputs; bad bodies, oversize prompts, disconnects and SIGTERM behave as documented."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from dspark_core.config import load_config  # noqa: E402
from dspark_core.engine import Engine  # noqa: E402
from dspark_core.verification.sampling import SamplingParams  # noqa: E402
from tests.serving import Server, scrape, serve_config  # noqa: E402

PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n",
           "class Stack:\n    def push(self, item):\n"]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    s = Server(serve_config(tmp_path_factory.mktemp("serve")))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> list[str]:

    eng = Engine(load_config(serve_config(tmp_path_factory.mktemp("gen"))))
    return [o.text for o in eng.generate(PROMPTS, SamplingParams(max_new_tokens=24)).outputs]


def test_openai_client_gets_generates_greedy_outputs(server: Server, expected: list[str]) -> None:
    c = server.client
    assert [m.id for m in c.models.list().data] == ["target"]
    got, streamed = [], []
    for p in PROMPTS:
        r = c.completions.create(model="target", prompt=p, max_tokens=24, temperature=0)
        assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"
        got.append(r.choices[0].text)
        chunks = list(c.completions.create(model="target", prompt=p, max_tokens=24, temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        streamed.append("".join(ch.choices[0].text for ch in chunks))
    assert got == expected
    assert streamed == expected


def test_chat_streaming_equals_non_streaming(server: Server) -> None:
    c = server.client
    msgs = [{"role": "user", "content": "def f(x):"}]
    whole = c.chat.completions.create(model="target", messages=msgs, max_tokens=16, temperature=0)
    parts, use = [], None
    for ch in c.chat.completions.create(model="target", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        use = ch.usage or use
    assert whole.choices[0].message.role == "assistant"
    assert "".join(parts) == whole.choices[0].message.content
    assert use is not None and use.completion_tokens == whole.usage.completion_tokens == 16


def test_stop_string_cuts_the_text(server: Server, expected: list[str]) -> None:
    stop = expected[0][5:8]
    r = server.client.completions.create(model="target", prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=stop)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == expected[0][: expected[0].find(stop)]


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"{not json", 400, "not valid JSON"),
    (b'{"prompt": "x", "frobnicate": 1}', 400, "frobnicate: unknown field"),
    (b'{"prompt": "x", "max_tokens": "many"}', 400, "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 10000}', 400, "exceed the context of 256"),
    (json.dumps({"prompt": "x " * 400}).encode(), 400, "context is 256"),
    (b'{"prompt": "x", "model": "gpt-9"}', 404, "not served here"),
    (b'{"prompt": "x", "n": 2}', 400, "n"),
    (b'{"prompt": []}', 400, "empty"),
])
def test_bad_requests_get_one_line(server: Server, body: bytes, status: int, says: str) -> None:
    code, err = server.post("/completions", body)
    assert code == status
    assert says in err["error"]["message"] and "\n" not in err["error"]["message"]


def test_disconnect_frees_the_slot(tmp_path: Path) -> None:
    """One slot, no queue: a client that drops its stream frees the slot for the next request."""
    s = Server(serve_config(tmp_path, max_requests=1), "--max-waiting", "0")
    try:
        sock = socket.create_connection(("127.0.0.1", int(s.url.split(":")[-1].split("/")[0])))
        body = json.dumps({"prompt": "x", "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert b"200 OK" in sock.recv(4096)
        code, _ = s.post("/completions", b'{"prompt": "y", "max_tokens": 2}')
        assert code == 429  # the slot is taken and nothing may queue
        sock.close()
        for _ in range(100):
            code, r = s.post("/completions", b'{"prompt": "y", "max_tokens": 2, "temperature": 0}')
            if code == 200:
                break
            time.sleep(0.1)
        assert code == 200 and r["usage"]["completion_tokens"] == 2
        m = scrape(s)
        assert m[("vllm:admission_rejections_total", "max_num_queued_reqs")] >= 1
        assert m[("vllm:request_success_total", "abort")] == 1
    finally:
        assert s.stop() == 0


def test_sigterm_finishes_in_flight_requests(tmp_path: Path) -> None:
    s = Server(serve_config(tmp_path))
    result: dict = {}

    def long_request() -> None:
        result["r"] = s.client.completions.create(model="target", prompt="x", max_tokens=150, temperature=0,
                                                  extra_body={"ignore_eos": True})

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.0)
    s.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert s.proc.wait(60) == 0
    assert result["r"].choices[0].finish_reason == "length" and result["r"].usage.completion_tokens == 150



def test_metrics_count_what_clients_got(server: Server) -> None:
    """vLLM's metric names; counter deltas over a batch of requests equal what the clients received."""
    before = scrape(server)
    got = [server.client.completions.create(model="target", prompt=p, max_tokens=n, temperature=0)
           for p, n in zip(PROMPTS * 2, (3, 9, 17, 5, 24, 1), strict=True)]
    after = scrape(server)

    def delta(name: str, key: str = "") -> float:
        return after.get((name, key), 0.0) - before.get((name, key), 0.0)

    assert delta("vllm:request_success_total", "length") == len(got)
    assert delta("vllm:generation_tokens_total") == sum(r.usage.completion_tokens for r in got)
    assert delta("vllm:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in got)
    assert delta("vllm:time_to_first_token_seconds_count") == len(got)
    assert delta("vllm:e2e_request_latency_seconds_count") == len(got)
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    drafted = delta("vllm:spec_decode_num_draft_tokens_total")
    assert 0 < accepted <= drafted <= delta("dspark:proposed_draft_tokens_total")
    assert sum(delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(p)) for p in range(16)) == accepted
    assert after[("vllm:num_requests_running", "")] == 0
    assert delta("dspark:draft_seconds_total") > 0 and delta("dspark:verify_seconds_total") > 0
    assert after[("dspark:sps", "")] > 0 and after[("dspark:block_length", "")] >= 1
