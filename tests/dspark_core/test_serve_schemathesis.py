"""Property-based fuzzing of `serve`'s HTTP API from its own OpenAPI schema (schemathesis, bounded in examples and
time): against a real `serve` process, no generated request gets a 5xx, /health is still 200 after each, and at the
end /metrics counters equal what the clients received."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.serving import Server, scrape, serve_config  # noqa: E402

KEY = "fuzz-key"
SEEN = {"ok": 0, "tokens": 0, "exact": True}  # 200 completions the clients got, their tokens; exact: all had usage
BEFORE: dict = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    s = Server(serve_config(tmp_path_factory.mktemp("fuzz")), "--static", api_key=KEY)
    BEFORE.update(scrape(s))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def operations(server: Server) -> list:
    """Every operation of the served OpenAPI schema (schemathesis' APIOperation)."""
    api = schemathesis.openapi.from_url(server.base + "/openapi.json")
    return [result.ok() for result in api.get_all_operations()]


def _record(path: str, response) -> None:  # noqa: ANN001 - schemathesis Response
    if response.status_code != 200 or not path.endswith("completions"):
        return
    SEEN["ok"] += 1
    text = response.content.decode(errors="replace")
    if text.startswith("data:"):
        events = [json.loads(ln[5:]) for ln in text.splitlines() if ln.startswith("data:") and "[DONE]" not in ln]
        assert not any("error" in e for e in events), text[-300:]
        use = [e["usage"] for e in events if e.get("usage")]
        if use:
            SEEN["tokens"] += use[-1]["completion_tokens"]
        else:
            SEEN["exact"] = False
    else:
        SEEN["tokens"] += json.loads(text)["usage"]["completion_tokens"]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_request_gets_a_5xx_or_kills_the_server(server: Server, operations: list, mode: str) -> None:
    """Valid bodies (positive) and bodies that break the schema (negative), a bounded number per operation."""
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
    fuzzed = set()
    for op in operations:
        if mode == "negative" and op.method.upper() != "POST":  # nothing to break in a GET without parameters
            continue

        @given(case=op.as_strategy(GenerationMode(mode)))
        @settings(max_examples=8 if op.method.upper() == "POST" else 2, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def one(case) -> None:  # noqa: ANN001 - schemathesis Case
            response = case.call(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
            assert response.status_code < 500, (case.method, case.path, case.body, response.content[:300])
            if response.status_code >= 400 and b'"error"' in response.content[:20]:
                assert "\n" not in json.loads(response.content)["error"]["message"]
            _record(case.path, response)
            with urllib.request.urlopen(server.base + "/health", timeout=10) as r:
                assert r.status == 200

        try:
            one()
        except Unsatisfiable:  # negative: an operation with no body schema (/admin/spec) has nothing to break
            assert mode == "negative" and not op.path.startswith("/v1/"), op.path
            continue
        fuzzed.add(op.path)
    assert {"/v1/completions", "/v1/chat/completions"} <= fuzzed


def test_metrics_equal_what_the_clients_received(server: Server) -> None:
    after = scrape(server)

    def delta(name: str) -> float:
        return sum(v for (n, _), v in after.items() if n == name) - sum(v for (n, _), v in BEFORE.items() if n == name)

    assert delta("vllm:request_success_total") == SEEN["ok"]
    if SEEN["exact"]:
        assert delta("vllm:generation_tokens_total") == SEEN["tokens"]
    else:
        assert delta("vllm:generation_tokens_total") >= SEEN["tokens"]
    assert after[("vllm:num_requests_running", "")] == 0
