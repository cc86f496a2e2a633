"""`python cli.py tune` through cli.main: bad inputs are one line and exit code 2; what `profile` stated
(SLOs, concurrency, accuracy floor, device count) reaches the study when `tune` switches the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def test_unknown_gpu_is_one_line_and_writes_nothing(capsys, tmp_path):
    code, _, err = run(capsys, "tune", "--model", "qwen3", "--gpu", "h999", "--out", str(tmp_path / "b"))
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "h999" in err and "GPU" in err
    assert not (tmp_path / "b").exists()


def test_unwritable_out_fails_before_any_trial(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--out", str(blocker / "b"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--out" in err and "Traceback" not in err
    assert "study" not in err  # refused before a study was opened or a trial ran


def test_slo_no_configuration_meets_is_one_line_with_the_closest_bundle(capsys, tmp_path):
    assert run(capsys, "profile", "--model", "qwen3", "--slo-tpot-ms", "0.5")[0] == 0
    out = tmp_path / "b"
    code, stdout, err = run(capsys, "tune", "--gpu", "h100", "--trials", "3", "--out", str(out), "--json")
    assert code == 2 and "Traceback" not in err
    assert last_line(err).startswith("error: no configuration met the SLOs in 3 trials")
    summary = json.loads(stdout)
    assert summary["trials"] == 3 and summary["meets_slo"] is False
    assert "tuning: 3/3 trials" in err  # --json keeps stdout for the summary, and still says each trial on stderr
    assert (out / "dspark.yaml").is_file() and "ms against 0.5 ms" in (out / "report.md").read_text()


def test_profile_traffic_and_floor_reach_the_tuned_profile(capsys, tmp_path):
    assert run(capsys, "profile", "--model", "qwen3", "--concurrency", "12", "--slo-ttft-ms", "0",
               "--slo-tpot-ms", "40", "--quality", "relaxed", "--gpus", "2")[0] == 0
    code, stdout, _ = run(capsys, "tune", "--gpu", "l40s", "--trials", "1", "--out", str(tmp_path / "b"), "--json")
    assert code in (0, 2)
    prov = json.loads((tmp_path / "b" / "provenance.json").read_text())
    text = json.dumps(prov)
    from kb.db import open_db
    from kb.store import latest_profile

    _, profile = latest_profile(open_db(None))
    assert profile.hw.name.lower().startswith("l40s") and profile.hw.count == 2
    assert profile.workload.concurrency == 12 and profile.workload.quality == "relaxed"
    assert profile.workload.slo.tpot_ms == 40 and profile.workload.slo.ttft_ms is None
    assert profile.content_hash() in text  # the study tuned this profile


def test_tune_options_override_the_stored_traffic(capsys, tmp_path):
    assert run(capsys, "profile", "--model", "qwen3", "--gpu", "h100")[0] == 0
    code, _, _ = run(capsys, "tune", "--concurrency", "3", "--slo-tpot-ms", "30", "--trials", "1",
                     "--out", str(tmp_path / "b"))
    assert code in (0, 2)
    from kb.db import open_db
    from kb.store import latest_profile

    _, profile = latest_profile(open_db(None))
    assert profile.workload.concurrency == 3 and profile.workload.slo.tpot_ms == 30
    assert profile.workload.slo.ttft_ms == 1000  # the chat preset's, not overridden
    assert profile.derived.decode_batch == 3  # derived figures follow the new load


@pytest.mark.parametrize("args, words", [
    (["--concurrency", "0"], "--concurrency 0"),
    (["--slo-tpot-ms", "-5"], "--slo-tpot-ms -5"),
    (["--slo-ttft-ms", "inf"], "--slo-ttft-ms inf"),
])
def test_bad_traffic_is_one_line(capsys, tmp_path, args, words):
    for cmd in (["profile", "--model", "qwen3", *args],
                ["tune", "--model", "qwen3", "--gpu", "h100", *args, "--out", str(tmp_path / "b")]):
        code, _, err = run(capsys, *cmd)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err
    assert not Path(tmp_path / "b").exists()


def test_a_cpu_measured_study_resumes_however_it_is_named(capsys, tmp_path):
    out = str(tmp_path / "b")  # no SLOs: whether a trial on shared cores meets them is not what this checks
    assert run(capsys, "profile", "--model", "tiny", "--gpu", "cpu", "--slo-tpot-ms", "0", "--slo-ttft-ms", "0")[0] == 0
    # eager trials: compiling the tiny target's shapes is tests/tuner/test_measure_compiled.py's, and costs minutes
    assert run(capsys, "tune", "--trials", "1", "--study", "m", "--out", out, "--trial-seconds", "20",
               "--no-compile")[0] == 0
    for extra in (["--gpu", "cpu"], ["--model", "tiny", "--gpu", "cpu"], []):  # re-profiles this CPU, same study
        code, _, err = run(capsys, "tune", "--trials", "2", "--study", "m", "--out", out, *extra)
        assert code == 0, err
    code, _, err = run(capsys, "tune", "--trials", "3", "--study", "m", "--out", out, "--compile")
    assert code == 2 and "study m measured eager steps; drop --compile to resume it" in err
    import optuna

    from kb.db import resolve_url
    from tuner.study import completed, storage

    study = optuna.load_study(study_name="m", storage=storage(resolve_url(None)))
    assert len(completed(study)) == 2


def test_studies_list_names_what_tune_made(capsys, tmp_path):
    assert run(capsys, "studies", "list")[1].startswith("no studies yet")
    assert run(capsys, "profile", "--model", "qwen3")[0] == 0
    code, _, _ = run(capsys, "tune", "--gpu", "h100", "--trials", "2", "--study", "s1", "--out", str(tmp_path / "b"))
    assert code in (0, 2)
    code, out, _ = run(capsys, "studies", "list", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["study"] for r in rows] == ["s1"]
    assert rows[0]["completed"] == 2 and rows[0]["mode"] == "simulate" and rows[0]["gpu"].startswith("H100")
    assert "s1" in run(capsys, "studies", "list")[1]
    code, _, err = run(capsys, "tune", "--study", "s1", "--trials", "3", "--out", str(tmp_path / "b"), "--compile")
    assert code == 2 and "--compile: only a measured study" in err and "this study is simulate" in err


def test_a_model_no_layout_runs_is_one_line_naming_the_limit(capsys, tmp_path):
    """DeepSeek-V3 in FP8 does not fit one 8-GPU H100 node: `tune` says so in one line, exit 2, and writes nothing."""
    assert run(capsys, "profile", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "8")[0] == 0
    code, _, err = run(capsys, "tune", "--gpu", "h100", "--trials", "2", "--out", str(tmp_path / "b"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no parallel layout runs DeepSeek-V3 on 8 x H100-SXM" in err and "--gpus" in err
    assert not (tmp_path / "b").exists()
