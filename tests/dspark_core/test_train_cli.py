"""`train-drafter` and `calibrate` end to end on a throw-away random target with its own small tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from dspark_core.cli.commands_dspark import register
from dspark_core.drafters.dspark_layout import load_drafter
from dspark_core.errors import DSparkError
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.checkpoint import load_model, save_model
from dspark_core.modeling.model import LeanModel
from dspark_core.training.build_tiny import stdlib_sources, train_tokenizer
from dspark_core.training.train import load_state
from dspark_core.verification.calibrate import StsCalibration


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("target")
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_sources()[:40]]
    tok_file = train_tokenizer(texts, d / "tok" / "tokenizer.json")
    vocab = json.loads(tok_file.read_text())["model"]["vocab"]
    torch.manual_seed(0)
    arch = ArchConfig(model_type="qwen3", vocab_size=len(vocab) + 1, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      tie_word_embeddings=True, qk_norm=True, eos_token_id=0)
    save_model(LeanModel(arch), d / "ckpt", dtype="fp32", tokenizer_file=tok_file)
    return d / "ckpt"


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_train_then_calibrate(target_dir, tmp_path) -> None:
    runner = CliRunner()
    out = tmp_path / "drafter"
    args = ["train-drafter", "--head", "markov", "--target", str(target_dir), "--out", str(out), "--state-dir",
            str(tmp_path / "state"), "--steps", "4", "--block-size", "4", "--layers", "1", "--rank", "8",
            "--batch-seqs", "4", "--anchors", "2", "--sequences", "16", "--prompt-len", "8", "--gen-len", "12",
            "--json"]
    res = runner.invoke(_app(), args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["head"] == "markov" and len(report["heldout_position_acceptance"]) == 4
    assert (tmp_path / "state" / "markov" / "train_state.pt").is_file() and not (out / "train_state.pt").exists()
    assert (tmp_path / "state" / "train_data.pt").is_file()  # the target's data, shared by the heads
    target = load_model(target_dir, "cpu", "fp32")
    assert load_drafter(out, target).cfg.block_size == 4
    # a rerun resumes at the last step: nothing left to train, same weights
    res = runner.invoke(_app(), args)
    assert res.exit_code == 0, res.output
    res = runner.invoke(_app(), ["calibrate", "--drafter", str(out), "--target", str(target_dir), "--sequences", "8",
                                 "--anchors", "4", "--prompt-len", "8", "--gen-len", "12", "--json"])
    assert res.exit_code == 0, res.output
    cal = StsCalibration.load(out / "sts.json")
    assert cal.gamma == 4 and cal.num_samples == 32 and len(cal.ece_after) == 4
    assert report["stale"] == []
    # retraining over a calibrated drafter says its calibration now belongs to the old weights
    res = runner.invoke(_app(), [*args[:-1], "--fresh", "--prompt-anchors", "--kl", "1.0"])
    assert res.exit_code == 0, res.output
    assert "previous weights; rerun `calibrate`" in " ".join(res.stdout.split())
    # resuming that state under the paper's loss would mix two objectives in one schedule: refused, naming both
    res = runner.invoke(_app(), args)
    assert isinstance(res.exception, DSparkError)
    assert "prompt_anchors True (now False), kl 1.0 (now 0.0)" in str(res.exception)


def test_code_from_installed_packages_ending_at_def_lines(target_dir, tmp_path) -> None:
    runner = CliRunner()
    state = tmp_path / "state"
    res = runner.invoke(_app(), ["train-drafter", "--head", "none", "--target", str(target_dir), "--out",
                                 str(tmp_path / "d"), "--state-dir", str(state), "--steps", "2", "--block-size", "4",
                                 "--layers", "1", "--batch-seqs", "4", "--anchors", "2", "--sequences", "8",
                                 "--prompt-len", "8", "--gen-len", "8", "--code-source", "site", "--def-fraction",
                                 "0.5", "--json"])
    assert res.exit_code == 0, res.output
    meta = load_state(state / "train_data.pt")["meta"]
    assert meta["code_source"] == "site" and meta["def_fraction"] == 0.5  # a cache of another recipe is not reused
    assert "target continuations: 8/8 rows" in res.stderr  # the long passes leave a progress trail in logs
    assert "target states: 8/8 rows" in res.stderr
    legs = json.loads((tmp_path / "d" / "config.json").read_text())["dspark_tune"]["extra"]["data"]
    recipe = legs[0]["recipe"]
    assert recipe["code_source"] == "site" and recipe["sequences"] == 8 and "target" not in recipe  # reproducible
    # resumed on other data: the config names both recipes and the step the second began at
    res = runner.invoke(_app(), ["train-drafter", "--head", "none", "--target", str(target_dir), "--out",
                                 str(tmp_path / "d"), "--state-dir", str(state), "--steps", "3", "--block-size", "4",
                                 "--layers", "1", "--batch-seqs", "4", "--anchors", "2", "--sequences", "8",
                                 "--prompt-len", "8", "--gen-len", "8", "--json"])
    assert res.exit_code == 0, res.output
    legs = json.loads((tmp_path / "d" / "config.json").read_text())["dspark_tune"]["extra"]["data"]
    assert [leg["from_step"] for leg in legs] == [0, 2] and "code_source" not in legs[1]["recipe"]


def test_init_from_starts_a_new_run_at_a_drafters_weights(target_dir, tmp_path) -> None:
    runner = CliRunner()
    base = ["train-drafter", "--head", "markov", "--target", str(target_dir), "--block-size", "4", "--layers", "1",
            "--rank", "8", "--batch-seqs", "4", "--anchors", "2", "--sequences", "8", "--prompt-len", "8",
            "--gen-len", "8", "--json"]
    res = runner.invoke(_app(), [*base, "--out", str(tmp_path / "a"), "--state-dir", str(tmp_path / "sa"), "--steps",
                                 "3"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(_app(), [*base, "--out", str(tmp_path / "b"), "--state-dir", str(tmp_path / "sb"), "--steps",
                                 "2", "--seed", "1", "--init-from", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    extra = json.loads((tmp_path / "b" / "config.json").read_text())["dspark_tune"]["extra"]
    assert extra["init_from"]["drafter"] == "a" and extra["init_from"]["steps"] == 3
    assert extra["init_from"]["data"][0]["recipe"]["seed"] == 0 and extra["data"][0]["recipe"]["seed"] == 1
    assert load_state(tmp_path / "sb" / "markov" / "train_state.pt")["init_from"]["drafter"] == "a"  # kept on resume
    # another shape is refused before any data is made, naming what differs
    res = runner.invoke(_app(), [*base[:-1], "--rank", "16", "--out", str(tmp_path / "c"), "--state-dir",
                                 str(tmp_path / "sc"), "--init-from", str(tmp_path / "a")])
    assert isinstance(res.exception, DSparkError) and "markov_rank 8 / 16" in str(res.exception)
    assert not (tmp_path / "sc" / "train_data.pt").exists()


def test_bad_options_are_user_errors(target_dir, tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(_app(), ["train-drafter", "--code-source", "github", "--target", str(target_dir),
                                 "--out", str(tmp_path / "x")])
    assert isinstance(res.exception, DSparkError) and "--code-source 'github'" in str(res.exception)
    res = runner.invoke(_app(), ["train-drafter", "--head", "lstm", "--target", str(target_dir),
                                 "--out", str(tmp_path / "x")])
    assert isinstance(res.exception, DSparkError) and "lstm" in str(res.exception)
    res = runner.invoke(_app(), ["calibrate", "--drafter", str(tmp_path / "missing"), "--target", str(target_dir)])
    assert isinstance(res.exception, DSparkError) and "no DSpark drafter" in str(res.exception)
