"""Issue 38 finding 9 through `profile` + `tune`: what the scripts pass is what runs. A prefill chunk never exceeds
the prefill token budget, CUDA graphs are never captured for more requests than may run, a closed loop of N clients
never gets a running cap above N (1024 for 64 clients was exported before), and both engines cap the context
alike."""

from __future__ import annotations

import pytest

import cli
from tests.tuner.test_bundle_scripts import run_script, value
from tuner.space import closed_loop_clients, consistent

CLIENTS = 12


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds")
    mp = pytest.MonkeyPatch()
    mp.setenv("DSPARK_DB", f"sqlite:///{root / 'kb.sqlite'}")
    try:
        assert cli.main(["profile", "--model", "qwen3", "--gpu", "h100", "--workload", "chat",
                         "--concurrency", str(CLIENTS)]) == 0
        assert cli.main(["tune", "--trials", "4", "--out", str(root / "out")]) in (0, 2)
    finally:
        mp.undo()
    return root


def test_the_sglang_script_passes_bounded_settings(bundle):
    code, argv, err = run_script(bundle / "out" / "sglang.sh", bundle, DRAFT_MODEL_PATH="/d")
    assert code == 0, err
    running = int(value(argv, "--max-running-requests"))
    assert running <= CLIENTS
    assert int(value(argv, "--cuda-graph-max-bs-decode") or 0) <= running
    assert int(value(argv, "--chunked-prefill-size") or 0) <= int(value(argv, "--max-prefill-tokens"))
    code, vargv, err = run_script(bundle / "out" / "vllm.sh", bundle, DRAFT_MODEL_PATH="/d")
    assert code == 0, err
    assert int(value(vargv, "--max-num-seqs")) == running
    assert value(argv, "--context-length") == value(vargv, "--max-model-len")


def test_the_report_says_why_the_running_cap_is_what_it_is(bundle):
    report = (bundle / "out" / "report.md").read_text()
    assert "**Running requests**" in report and f"{CLIENTS} closed-loop clients" in report


def test_open_loop_traffic_keeps_the_searched_cap():
    class W:
        request_rate, concurrency = 5.0, 64

    assert closed_loop_clients(W()) == 0
    W.request_rate = 0.0
    assert closed_loop_clients(W()) == 64
    assert consistent({"batch.max_requests": 1024, "batch.cuda_graph_max_bs": 544}, 64) == {
        "batch.max_requests": 64, "batch.cuda_graph_max_bs": 64}
    assert consistent({"batch.max_requests": 1024}, 0) == {"batch.max_requests": 1024}
