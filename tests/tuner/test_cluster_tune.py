"""`tune --serving agg|disagg|auto --gpus N`: the deployment planned, its decoding server tuned, every worker's
launch script exported (tuner/cluster_tune.py, tuner/cluster_scripts.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import cli
from tuner.cluster import Assumptions, Layout, replicas_of, tps, with_worker
from tuner.cluster_tune import placement


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _tune(capsys, out: Path, serving: str, *extra: str) -> tuple[int, dict, str]:
    code, stdout, err = run(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--gpus", "16", "--serving",
                            serving, "--trials", "3", "--cost", "roofline", "--out", str(out), "--json", *extra)
    return code, (json.loads(stdout) if stdout.strip() else {}), err


def _syntax_ok(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script.read_text()


def test_disaggregated_bundle_has_both_workers_and_the_router(capsys, tmp_path):
    code, summary, err = _tune(capsys, tmp_path / "b", "disagg")
    assert code in (0, 2) and summary, err  # 2: three trials may miss the worker's SLOs (the closest is exported)
    b = tmp_path / "b"
    c = json.loads((b / "cluster.json").read_text())
    lay = c["chosen"]
    assert lay["mode"] == "disagg" and summary["cluster"]["chosen"] == lay
    assert lay["prefill_workers"] * lay["prefill_tp"] + lay["decode_workers"] * lay["decode_tp"] == lay["gpus"] <= 16
    assert sorted(w["role"] for w in c["placement"]).count("decode") == lay["decode_workers"]
    for name in ("sglang_prefill.sh", "sglang_decode.sh", "sglang_router.sh", "vllm_prefill.sh", "vllm_decode.sh"):
        _syntax_ok(b / name)
    prefill = (b / "sglang_prefill.sh").read_text()
    assert '"$here/sglang.sh"' in prefill and "--disaggregation-mode prefill" in prefill
    assert (f"--tp-size {lay['prefill_tp']}" in prefill) == (lay["prefill_tp"] != lay["decode_tp"])
    assert "--disaggregation-mode decode" in (b / "sglang_decode.sh").read_text()
    assert "NixlConnector" in (b / "vllm_decode.sh").read_text()
    assert "The deployment across 16 GPUs" in (b / "report.md").read_text() and (b / "cluster.png").is_file()
    prov = json.loads((b / "provenance.json").read_text())
    assert prov["cluster"] == "cluster.json"
    # the study tuned the decode worker: its TP and load, prompts arriving prefilled (no TTFT SLO of its own)
    from kb.db import open_db
    from kb.store import latest_profile

    _, worker = latest_profile(open_db(None))
    assert worker.hw.count == lay["decode_tp"] and worker.workload.concurrency == c["planned"]["decode_batch"]
    if c["slo"]["ttft_ms"]:  # the decode worker's own TTFT: what the prefill and the KV transfer leave
        left = max(1.0, c["slo"]["ttft_ms"] - c["planned"]["ttft_ms"])
        assert worker.workload.slo.ttft_ms == pytest.approx(left)


def test_aggregated_bundle_starts_replicas_and_reexports_the_same_deployment(capsys, tmp_path):
    code, summary, err = _tune(capsys, tmp_path / "b", "agg")
    assert code in (0, 2) and summary, err
    b = tmp_path / "b"
    lay = json.loads((b / "cluster.json").read_text())["chosen"]
    assert lay["mode"] == "agg" and lay["replicas"] * lay["tp"] == 16
    for name in ("cluster_sglang.sh", "cluster_vllm.sh"):
        _syntax_ok(b / name)
    text = (b / "cluster_sglang.sh").read_text()
    assert "sglang_router.launch_router" in text and f"per_node={16 // 2 // lay['tp']}" in text
    run(capsys, "export", "--study", summary["study"], "--out", str(tmp_path / "again"), "--json")
    assert json.loads((tmp_path / "again" / "cluster.json").read_text())["chosen"] == lay


def test_replica_script_refuses_a_bad_node_rank(capsys, tmp_path):
    assert _tune(capsys, tmp_path / "b", "agg")[0] in (0, 2)
    p = subprocess.run(["bash", str(tmp_path / "b" / "cluster_sglang.sh")],
                       env={"NODE_RANK": "7", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert p.returncode == 2 and "NODE_RANK=7" in p.stderr


@pytest.mark.parametrize("argv, said", [
    (["--serving", "both"], "agg, disagg or auto"),
    (["--serving", "agg", "--gpus", "12", "--nodes", "5"], "do not split evenly"),
    (["--nodes", "2"], "add --serving"),
    (["--serving", "agg", "--mode", "measure"], "simulator"),
    (["--serving", "disagg", "--gpus", "1"], "cannot hold a prefill and a decode worker"),
])
def test_bad_serving_options_are_one_line(capsys, tmp_path, argv, said):
    code, _, err = run(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--out", str(tmp_path / "b"), *argv)
    assert code == 2 and "Traceback" not in err and said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_no_layout_meeting_the_slo_is_one_line(capsys, tmp_path):
    code, _, err = _tune(capsys, tmp_path / "b", "auto", "--slo-tpot-ms", "0.01")
    assert code == 2 and "no agg or disagg layout" in err and "Traceback" not in err


def test_a_model_no_node_can_hold_is_said_so_not_blamed_on_the_slo(capsys, tmp_path):
    code, _, err = run(capsys, "tune", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "16", "--serving", "auto",
                       "--trials", "3", "--cost", "roofline", "--out", str(tmp_path / "b"), "--json")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "do not fit 8 x H100" in err and "does not span nodes" in err and "loosen the SLOs" not in err
    assert not (tmp_path / "b").exists()


def test_tp_sizes_divide_a_node_and_replicas_fill_the_nodes() -> None:
    assert tps(16, 8) == [1, 2, 4, 8] and tps(12, 6) == [1, 2] and tps(4, 8) == [1, 2, 4]
    assert replicas_of(16, 4, 8) == 4 and replicas_of(12, 2, 6) == 6 and replicas_of(4, 2, 8) == 2


def test_placement_packs_every_worker_onto_its_node() -> None:
    lay = Layout("disagg", 16, 1.0, 1.0, 1.0, 1.0, prefill_tp=1, prefill_workers=6, decode_tp=2, decode_workers=5)
    where = placement(lay, 2, 8)
    used = {(w["node"], g) for w in where for g in w["gpus"]}
    assert len(used) == 16 and len(where) == 11 and all(len(w["gpus"]) in (1, 2) for w in where)


def test_a_faster_decode_worker_shifts_gpus_to_prefill() -> None:
    lay = Layout("disagg", 16, 0.0, 50.0, 100.0, 20.0, prefill_tp=1, prefill_workers=8, prefill_batch=1,
                 decode_tp=2, decode_workers=4, decode_batch=64, prefill_rate=10.0, decode_rate=10.0)
    none = Assumptions()  # no disaggregation losses
    slow = with_worker(lay, 10.0 * 200, 20.0, 16, 200, none)
    fast = with_worker(lay, 40.0 * 200, 10.0, 16, 200, none)
    assert fast.prefill_workers > slow.prefill_workers and fast.tokens_per_s_gpu > slow.tokens_per_s_gpu
    assert fast.tokens_per_s_user == pytest.approx(100.0)
    lossy = with_worker(lay, 40.0 * 200, 10.0, 16, 200)  # the planner's: AIC's decode latency x 1.08, share 0.92
    assert lossy.tpot_ms == pytest.approx(10.8) and lossy.tokens_per_s_gpu <= fast.tokens_per_s_gpu
    agg = Layout("agg", 16, 100.0, 20.0, 100.0, 50.0, tp=2, replicas=8, batch=32)
    assert with_worker(agg, 400.0, 25.0, 16, 200).tokens_per_s_gpu == pytest.approx(400.0 * 8 / 16)
