"""`serve --reconfigurable`: the verify-length settings change between requests without a restart (what a live
study varies within one server life); everything else, a busy engine and a server started without the flag refuse
in one line, and nothing changes on a refusal."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from dspark_core.config import HOT_SPEC, EngineConfig
from dspark_core.engine import Engine
from dspark_core.errors import DSparkError, EngineBusy
from kb.params import all_params
from tests.serving import Server, scrape, serve_config

PROMPTS = ["def add(a, b):", "The capital of France"]


def _admin(server: Server, body: object) -> tuple[int, dict]:
    url = server.url.removesuffix("/v1") + "/admin/spec"
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers=server.headers(**{"Content-Type": "application/json"}))
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _texts(server: Server) -> list[str]:
    out = []
    for p in PROMPTS:
        body = json.dumps({"prompt": p, "max_tokens": 12, "temperature": 0}).encode()
        status, body = server.post("/completions", body)
        assert status == 200, body
        out.append(body["choices"][0]["text"])
    return out


def test_hot_fields_are_the_params_catalogue_says_the_engine_takes_hot():
    hot = {name.removeprefix("spec.") for name, p in all_params().items() if "engine" in p.hot}
    assert hot == set(HOT_SPEC) - {"policy_path", "gamma_policy_path"}  # the paths ride with their choices


def test_a_running_server_changes_its_scheduler_and_stays_lossless(tmp_path: Path):
    srv = Server(serve_config(tmp_path), "--reconfigurable", api_key="k-reconfigure")
    try:
        before = _texts(srv)
        status, body = _admin(srv, {"scheduler": "prefix", "max_verify_tokens": 2, "adaptive_gamma": True})
        assert status == 200, body
        assert body["spec"]["scheduler"] == "prefix" and body["spec"]["max_verify_tokens"] == 2
        assert _texts(srv) == before  # fp32 greedy: any verify length commits the same tokens
        info = [k for k in scrape(srv) if k[0] == "dspark:engine_info"]
        assert info, "engine_info missing"
        with urllib.request.urlopen(srv.url.removesuffix("/v1") + "/metrics", timeout=30) as r:
            assert 'scheduler="prefix"' in r.read().decode()
        status, body = _admin(srv, {"block_size": 3})
        assert status == 400 and "need a restart" in body["error"]["message"]
        status, body = _admin(srv, {"scheduler": "nope"})
        assert status == 400 and "spec.scheduler" in body["error"]["message"]
        status, body = _admin(srv, ["scheduler"])
        assert status == 400 and "JSON object" in body["error"]["message"]
        status, body = _admin(srv, {"scheduler": "learned"})  # no policy file: refused, the old scheduler stays
        assert status == 400 and "policy_path" in body["error"]["message"]
        assert _texts(srv) == before
    finally:
        assert srv.stop() == 0


def test_without_the_flag_the_endpoint_is_not_there(tmp_path: Path):
    srv = Server(serve_config(tmp_path))
    try:
        status, body = _admin(srv, {"scheduler": "prefix"})
        assert status == 404 and "--reconfigurable" in body["error"]["message"]
    finally:
        srv.stop()


def test_the_engine_refuses_while_requests_are_in_flight():
    eng = Engine(EngineConfig(device="cpu"))
    eng.add_request("def f(")
    with pytest.raises(EngineBusy, match="in flight"):
        eng.reconfigure({"scheduler": "prefix"})
    while eng.has_work():
        eng.step()
    spec = eng.reconfigure({"scheduler": "threshold", "confidence_threshold": 0.3})
    assert spec.scheduler == eng.config.spec.scheduler == "threshold" and eng.scheduler.name == "threshold"
    with pytest.raises(DSparkError, match="need a restart"):
        eng.reconfigure({"scheduler": "prefix", "block_size": 2})
    assert eng.config.spec.scheduler == "threshold"  # all or nothing
