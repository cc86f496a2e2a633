"""`python cli.py profile` through cli.main: output, storage, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

import cli
from profiler.catalog import gpus, models, resolve_model

from .conftest import CONFIGS


def _run_json(capsys, *args: str) -> dict:
    assert cli.main(["profile", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_profile_qwen3_h100_json_is_stored_and_readable(capsys):
    out = _run_json(capsys, "--model", "qwen3", "--gpu", "h100")
    entry, _ = resolve_model("Qwen3-8B")
    assert out["model"]["name"] == "Qwen3-8B"
    assert abs(out["model"]["params_total"] / entry.published.params_total - 1) < 0.01
    assert out["model"]["params_active"] == out["model"]["params_total"]
    assert out["hw"]["name"] == "H100-SXM" and out["hw"]["peak_tflops"]["bf16"] > 0
    assert out["derived"]["decode_bound"] in ("memory", "compute")
    assert out["model"]["ops"]["rmsnorm"] >= 2
    assert any("Qwen3-8B" in n for n in out["notes"])  # says what 'qwen3' resolved to

    from kb.db import open_db
    from kb.store import get_profile, latest_profile

    db = open_db(None)
    try:
        pid, stored = latest_profile(db)
        assert stored.model.params_total == out["model"]["params_total"]
        assert get_profile(db, pid).hw.name == "H100-SXM"
    finally:
        db.dispose()


def test_profile_moe_reports_active_and_human_summary(capsys):
    assert cli.main(["profile", "--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--workload", "code"]) == 0
    text = capsys.readouterr().out
    assert "Qwen3-30B-A3B" in text and "moe" in text and "stored as profile" in text
    assert "match --profile-id" in text  # the option match really has
    assert "bound" in text  # the verdict names what bounds decode


@pytest.mark.parametrize("spelling", ["h100", "H100-SXM", "h100_sxm", "NVIDIA H100 80GB HBM3"])
def test_gpu_names_are_forgiving(capsys, spelling):
    assert _run_json(capsys, "--gpu", spelling, "--no-store")["hw"]["name"] == "H100-SXM"


def test_profile_from_config_file_and_folder(capsys, tmp_path):
    by_file = _run_json(capsys, "--model", str(CONFIGS / "mixtral-8x7b-v0.1.json"), "--no-store")
    folder = tmp_path / "Mixtral-8x7B"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "mixtral-8x7b-v0.1.json").read_text())
    by_folder = _run_json(capsys, "--model", str(folder), "--no-store")
    assert by_file["model"]["params_total"] == by_folder["model"]["params_total"]
    assert by_folder["model"]["name"] == "Mixtral-8x7B" and by_folder["model"]["arch"] == "moe"


def test_profile_from_onnx_file(capsys, tmp_path):
    from profiler.arch import read_config
    from profiler.census import export_layer

    path = tmp_path / "layer.onnx"
    export_layer(read_config(json.loads((CONFIGS / "qwen3-8b.json").read_text())), path)
    out = _run_json(capsys, "--model", str(path), "--no-store")
    assert out["model"]["ops"]["rope"] == 2 and out["model"]["params_total"] > 0


def test_list_models_and_gpus(capsys):
    out = _run_json(capsys, "--list-models", "--list-gpus")
    assert [m["name"] for m in out["models"]] == [m.name for m in models()]
    assert {g["name"] for g in out["gpus"]} == {g.name for g in gpus()}
    assert cli.main(["profile", "--list-gpus"]) == 0
    assert "MI300X" in capsys.readouterr().out


def _error(capsys, *args: str) -> str:
    assert cli.main(["profile", *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err
    return err


def test_missing_config_file(capsys, tmp_path):
    assert "not found" in _error(capsys, "--model", str(tmp_path / "nope" / "config.json"))


def test_invalid_json(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", ')
    assert "invalid JSON" in _error(capsys, "--model", str(bad))


def test_config_with_no_known_architecture(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 768}))
    assert "unknown architecture" in _error(capsys, "--model", str(cfg))


def test_unknown_model_lists_closest_names(capsys):
    err = _error(capsys, "--model", "qwen3-9b")
    assert "closest" in err and "Qwen3-8B" in err


def test_unknown_gpu_lists_known(capsys):
    err = _error(capsys, "--gpu", "h900")
    assert "H100-SXM" in err and "MI300X" in err


def test_bad_workload_file(capsys, tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"prompt": "hi"}\n{"output_len": 3}\n')
    assert "w.jsonl:2" in _error(capsys, "--model", "qwen3", "--workload", str(wl))
    wl.write_text('{"prompt": "hi"\n')
    assert "w.jsonl:1: not valid JSON" in _error(capsys, "--model", "qwen3", "--workload", str(wl))
    assert "not found" in _error(capsys, "--model", "qwen3", "--workload", str(tmp_path / "none.jsonl"))
    wl.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8
    assert "w.jsonl:2: not UTF-8" in _error(capsys, "--model", "qwen3", "--workload", str(wl))
    for bad in (0, -5):
        wl.write_text(f'{{"prompt": "hi", "output_len": {bad}}}\n')
        assert "w.jsonl:1: output_len" in _error(capsys, "--model", "qwen3", "--workload", str(wl))
    wl.write_text('{"prompt": "hi"}\n{"prompt": "hi", "output_len": 100000}\n')  # Qwen3-8B's context: 40960
    err = _error(capsys, "--model", "qwen3", "--workload", str(wl))
    assert "w.jsonl:2" in err and "context of 40960" in err


def test_a_preset_is_scaled_to_a_short_context(capsys):
    out = _run_json(capsys, "--model", "tiny", "--workload", "chat", "--no-store", "--no-entropy")
    wl = out["workload"]
    assert wl["prompt_len"]["p99"] + wl["output_len"]["p99"] <= 2048  # the tiny target's context
    assert any("scaled" in n for n in out["notes"])


def test_nothing_to_profile(capsys):
    assert "nothing to profile" in _error(capsys)


def test_gpu_auto_measures_this_machine(capsys):
    out = _run_json(capsys, "--model", "qwen3-0.6b", "--gpu", "auto", "--no-store", "--no-entropy")
    measured = out["hw"]["measured"]
    assert measured["bandwidth_gbs"] > 0 and (measured.get("tflops_bf16") or measured.get("tflops_fp32")) > 0
    assert out["derived"]["decode_bound"] in ("memory", "compute")  # measured ceilings stand in for a datasheet


def test_quality_and_gpu_count_reach_the_profile_and_the_plan(capsys):
    out = _run_json(capsys, "--model", "qwen3", "--gpu", "h100", "--quality", "relaxed", "--gpus", "2", "--no-store")
    assert out["workload"]["quality"] == "relaxed" and out["hw"]["count"] == 2
    plain = _run_json(capsys, "--model", "qwen3", "--gpu", "h100", "--no-store")
    assert "quality" not in plain["workload"] and "count" not in plain["hw"]  # not stated: nothing invented


@pytest.mark.parametrize("args, words", [(["--quality", "lossy"], "standard, relaxed"),
                                         (["--gpus", "0"], "at least 1")])
def test_bad_quality_or_gpu_count_is_one_line(capsys, args, words):
    assert words in _error(capsys, "--model", "qwen3", "--gpu", "h100", *args)
