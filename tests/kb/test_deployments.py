"""Monitored deployments in the knowledge base (SQLite and PostgreSQL), and the window arithmetic over the
samples of each server family."""

from __future__ import annotations

import pytest

from kb.db import open_db
from kb.deployments import (
    Sample,
    add_sample,
    deployment,
    list_deployments,
    monitored_acceptance,
    resolve,
    start_deployment,
    window,
)
from kb.errors import KBError

VLLM_TEXT = """\
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {dt}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {acc}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {h1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",model_name="m"}} {h2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {h2}
"""


def _vllm(t: float, **kw) -> Sample:
    from live.scrape import parse

    return parse(VLLM_TEXT.format(**kw), t)


def test_vllm_window() -> None:
    a = _vllm(0.0, running=0, gen=0, drafts=0, dt=0, acc=0, p0=0, p1=0, h1=0, h2=0)
    b = _vllm(10.0, running=3, gen=500, drafts=100, dt=200, acc=120, p0=80, p1=40, h1=50, h2=100)
    assert a.kind == b.kind == "vllm"
    w = window(a, b)
    assert w["output_tokens_per_s"] == 50.0 and w["running"] == 3
    assert w["tau"] == pytest.approx(2.2) and w["acceptance_rate"] == pytest.approx(0.6)
    assert w["position_acceptance"] == pytest.approx([0.8, 0.5])  # attempts at 2 = acceptances at 1
    assert w["ttft_p50_ms"] == pytest.approx(100.0)  # half the observations are below 0.1 s
    assert w["ttft_p99_ms"] == pytest.approx(100 + 900 * 0.98)


def test_sglang_window_reads_its_gauges() -> None:
    from live.scrape import parse

    text = ('sglang:num_running_reqs{{model_name="m"}} 2\nsglang:generation_tokens_total{{model_name="m"}} {g}\n'
            'sglang:spec_accept_length{{model_name="m"}} 3.1\nsglang:spec_accept_rate{{model_name="m"}} 0.7\n')
    a, b = parse(text.format(g=0), 0.0), parse(text.format(g=300), 3.0)
    assert b.kind == "sglang"
    w = window(a, b)
    assert w["tau"] == 3.1 and w["acceptance_rate"] == 0.7 and w["output_tokens_per_s"] == 100.0
    assert "position_acceptance" not in w


def test_deployments_round_trip(db_url: str) -> None:
    db = open_db(db_url)
    with pytest.raises(KBError, match="no deployment has been monitored"):
        resolve(db, "latest")
    dep = start_deployment(db, "http://x/metrics", "dspark", "out", {"tau": 2.0, "head": "markov"})
    a = Sample(t=1.0, kind="dspark", drafts=0, accepted_pos=[0, 0], verified_pos=[0, 0])
    b = Sample(t=5.0, kind="dspark", drafts=50, accepted=60, draft_tokens=100, accepted_pos=[40, 20],
               verified_pos=[50, 25], engine={"head": "markov", "block_size": "2"})
    add_sample(db, dep, a)
    add_sample(db, dep, b)
    assert resolve(db, "latest") == resolve(db, str(dep)) == dep
    info, samples = deployment(db, dep)
    assert info["predictions"]["tau"] == 2.0 and samples == [a, b]
    assert list_deployments(db)[0]["samples"] == 2
    acc = monitored_acceptance(db, "latest", "code")
    assert acc.per_head == {"markov": [0.8, 0.8]} and acc.tau == 2.2 and acc.gamma == 2
    assert acc.source.startswith(f"measured: monitor deployment {dep} ")
    with pytest.raises(KBError, match="no monitored deployment 99"):
        resolve(db, 99)
    db.dispose()
