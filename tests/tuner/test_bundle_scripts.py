"""The bundle's shell scripts as a user runs them (bash, unmodified), with `python` / `vllm` replaced by a probe that
prints the command line it got: every value arrives as one word, hostile names execute nothing, MODEL_PATH and
DRAFT_MODEL_PATH override the defaults, and flags that do nothing under the exported verify mode are not there.
(benchmarks/interop_check.py runs the same scripts against the released SGLang and vLLM.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cli
from dspark_core.config import ASSETS

PROBE = f"""#!/usr/bin/env bash
{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""


def _probe_bin(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    for name in ("python", "vllm"):
        (folder / name).write_text(PROBE)
        (folder / name).chmod(0o755)
    return folder


def run_script(script: Path, cwd: Path, **env: str) -> tuple[int, list[str], str]:
    e = {**os.environ, "PATH": f"{_probe_bin(cwd / 'bin')}:{os.environ['PATH']}", **env}
    for k in ("MODEL_PATH", "DRAFT_MODEL_PATH", "SGLANG_RAGGED_VERIFY_MODE"):
        if k not in env:
            e.pop(k, None)
    p = subprocess.run(["bash", str(script)], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    return p.returncode, json.loads(lines[-1]) if lines else [], p.stderr


def value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


STUDY = "s$(touch PWNED5);'x'`touch PWNED6`[/b]"  # printable: a valid study name (Rich markup too), in every script


@pytest.fixture(scope="module")
def hostile_bundle(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("hostile")
    model = root / "m$(touch PWNED) 'q' `touch PWNED2` é🙂 \\ ${HOME}"
    shutil.copytree(ASSETS / "target", model)
    drafter = root / 'd"$(touch PWNED3)"; touch PWNED4 & !x'
    shutil.copytree(ASSETS / "drafters" / "markov", drafter)
    os.environ["DSPARK_DB"] = f"sqlite:///{root / 'kb.sqlite'}"
    try:
        assert cli.main(["profile", "--model", str(model), "--gpu", "h100", "--drafter", str(drafter)]) == 0
        out = root / "bundle"
        assert cli.main(["tune", "--trials", "3", "--study", STUDY, "--out", str(out)]) in (0, 2)
    finally:
        del os.environ["DSPARK_DB"]
    return out, model, drafter


def test_hostile_paths_run_nothing_and_arrive_whole(hostile_bundle, tmp_path):
    out, model, drafter = hostile_bundle
    for script in ("sglang.sh", "vllm.sh", "dspark.sh"):  # comments and echo lines carry the names too
        assert subprocess.run(["bash", "-n", str(out / script)]).returncode == 0
        assert STUDY in (out / script).read_text() and model.name in (out / script).read_text()
    for script in ("sglang.sh", "vllm.sh"):
        code, argv, err = run_script(out / script, tmp_path)
        assert code == 0, err
        assert not list(tmp_path.glob("PWNED*")) and not list(out.parent.glob("PWNED*"))
        if script == "sglang.sh":
            assert argv[:2] == ["-m", "sglang.launch_server"]
            assert value(argv, "--model-path") == str(model.resolve())
            assert value(argv, "--speculative-draft-model-path") == str(drafter.resolve())
        else:
            assert argv[:2] == ["serve", str(model.resolve())]
            spec = json.loads(value(argv, "--speculative-config"))
            assert spec["model"] == str(drafter.resolve()) and spec["method"] == "dspark"


def test_environment_overrides_the_defaults(hostile_bundle, tmp_path):
    out, _, _ = hostile_bundle
    code, argv, _ = run_script(out / "sglang.sh", tmp_path, MODEL_PATH="/models/x y", DRAFT_MODEL_PATH="/d/$(id)")
    assert code == 0 and value(argv, "--model-path") == "/models/x y"
    assert value(argv, "--speculative-draft-model-path") == "/d/$(id)"
    code, argv, _ = run_script(out / "vllm.sh", tmp_path, MODEL_PATH="/models/x y", DRAFT_MODEL_PATH="/d/$(id)")
    assert code == 0 and argv[1] == "/models/x y"
    assert json.loads(value(argv, "--speculative-config"))["model"] == "/d/$(id)"
    assert json.loads((out / "vllm.json").read_text())["model"] != "DRAFT_MODEL_PATH"  # the old placeholder


def test_static_mode_exports_no_flag_that_does_nothing(hostile_bundle, tmp_path):
    out, _, _ = hostile_bundle
    sh = (out / "sglang.sh").read_text()
    mode = "compact" if 'SGLANG_RAGGED_VERIFY_MODE:-compact' in sh else "static"
    code, argv, _ = run_script(out / "sglang.sh", tmp_path)
    ragged_flags = {"--speculative-dspark-sps-table-path", "--speculative-dspark-confidence-sts-path",
                    "--speculative-dspark-align-verify-tokens-to-graph-tier"}
    if mode == "static":
        assert not ragged_flags & set(argv)
    else:
        assert {"--speculative-dspark-sps-table-path", "--speculative-dspark-confidence-sts-path"} <= set(argv)
    assert "--cuda-graph-max-bs" not in argv and "--enable-dp-attention" not in argv  # gone / deprecated in 0.5.23


def test_no_drafter_means_the_scripts_ask_for_one(tmp_path):
    """--drafter none: design a DSpark drafter to train (by default a model without one deploys a method it can
    run: tests/tuner/test_method_search.py)."""
    os.environ["DSPARK_DB"] = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    try:
        assert cli.main(["profile", "--model", "llama-3.1-70b", "--gpu", "h200", "--drafter", "none"]) == 0
        assert cli.main(["tune", "--trials", "2", "--out", str(tmp_path / "b")]) in (0, 2)
    finally:
        del os.environ["DSPARK_DB"]
    for script in ("sglang.sh", "vllm.sh"):
        code, argv, err = run_script(tmp_path / "b" / script, tmp_path)
        assert code != 0 and not argv and "DRAFT_MODEL_PATH" in err  # refuses before starting anything
        code, argv, _ = run_script(tmp_path / "b" / script, tmp_path, DRAFT_MODEL_PATH="/drafters/mine")
        assert code == 0 and "/drafters/mine" in " ".join(argv)
        assert "meta-llama/Llama-3.1-70B" in argv  # the default model is its Hugging Face id, never a URL
    assert "Llama-architecture target" in (tmp_path / "b" / "vllm.sh").read_text()
