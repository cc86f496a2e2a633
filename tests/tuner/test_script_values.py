"""Every value that reaches a launch script, hostile: refused with one line when it holds a line-breaking character
(newline, CR, NUL, ESC, tab, C1, U+2028 / U+2029, bidi overrides), otherwise written so that bash parses the script
and runs nothing from it, and the value arrives as one exact argument.

The writer is driven with the real contexts (tuner/targets.py) in several configurations, so that every template
branch renders (the comment lines, the echo line, the `${VAR:?message}` lines, the multi-node lines); the edge
refusals go through `profile` and `tune`. tests/tuner/test_bundle_scripts.py runs a whole hostile bundle.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from dspark_core.config import ASSETS
from tests.tuner.fixtures import plan, profile, refused
from tuner.errors import TunerError
from tuner.launch import DSPARK_TEMPLATES, TEMPLATES, template_env, write_dspark, write_sglang, write_vllm
from tuner.space import engine_defaults, space_from_plan
from tuner.targets import sglang_context, vllm_context

ALLOWED = ("m$(touch PWNED1) `touch PWNED2`; touch PWNED3 & |x| <y> 'q' \"d\" \\ *? ~ $HOME ${X:-y} !! "
           "-n é 中 🙂")
REFUSED = {"newline": "a\nb", "carriage return": "a\rb", "NUL": "a\0b", "escape": "a\x1b[31mb", "tab": "a\tb",
           "vertical tab": "a\x0bb", "DEL": "a\x7fb", "next line (C1)": "a\x85b", "line separator": "a\u2028b",
           "paragraph separator": "a\u2029b", "bidi override": "a\u202eb"}
COMMON = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H100-SXM", "model_name": "Qwen3-8B"}
OPTION = {"model_path": "--model", "model_name": "--model", "draft_path": "--drafter", "study": "--study",
          "hw_name": "--gpu"}
TOKEN_KEYS = {"head", "verify_mode", "method", "sglang_algorithm", "adaptive_file"}  # rendered inside double quotes
# or a flag's value: inert characters only, refused otherwise
STUB = """#!/usr/bin/env bash
printf '%s\\0' "$(basename "$0")" "$@" > "$ARGV_LOG"
"""
STUBS = ("python", "vllm", "dspark-python")  # what sglang.sh, vllm.sh and dspark.sh exec


def _params(**kw):
    base = space_from_plan(plan()).params_of({"spec.block_size": 7, "spec.scheduler": "prefix",
                                              "batch.max_requests": 32})
    return {**engine_defaults(), **base, **kw}


def _profile(**hw):
    p = profile()
    return p.model_copy(update={"hw": p.hw.model_copy(update=hw)}) if hw else p


# (script, writer, context): every branch of both templates renders in at least one
VARIANTS = {
    "sglang-multinode": ("sglang.sh", write_sglang, sglang_context(_profile(), _params(**{"parallel.tp": 16}), False,
                                                                    4096)),
    "sglang-static": ("sglang.sh", write_sglang, sglang_context(_profile(), _params(**{
        "spec.scheduler": "verify_all", "kv.dtype": "fp8_e4m3", "weights.dtype": "fp8"}), False, 4096)),
    "vllm-gpu": ("vllm.sh", write_vllm, vllm_context(_profile(), _params(**{"weights.dtype": "fp8"}), False, 4096)),
    "vllm-rnn-head": ("vllm.sh", write_vllm, vllm_context(_profile(), _params(**{"spec.head": "rnn"}), False, 4096)),
    "vllm-cpu": ("vllm.sh", write_vllm, vllm_context(_profile(arch="cpu"), _params(), False, 4096)),
    "vllm-draft-model": ("vllm.sh", write_vllm, vllm_context(_profile(), _params(**{"spec.method": "draft_model"}),
                                                              False, 4096, draft_model="/d")),
}


def _hostile_keys(ctx: dict) -> list[str]:
    """The context values a user's input could reach: strings, lists and unset (None) optional values; numbers
    are computed with int() / float() (tuner/targets.py)."""
    return [k for k, v in ctx.items() if not isinstance(v, (bool, int, float)) and k != "speculative_config_json"]


def run(script: Path, cwd: Path, real_python3: bool = True, **env: str) -> tuple[int, list[str], str]:
    """bash SCRIPT with the engine it execs replaced by a stub that logs its argv; (exit code, that argv, stderr).
    `real_python3`: vllm.sh's JSON step runs (else a stub: faster, when the draft path is not what is checked)."""
    stubs = cwd / "bin"
    stubs.mkdir(exist_ok=True)
    for name in STUBS if real_python3 else (*STUBS, "python3"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    log = cwd / "argv.log"
    log.write_bytes(b"")
    e = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DRAFT_MODEL_PATH",
                                                            "SGLANG_RAGGED_VERIFY_MODE")}
    e.update(PATH=f"{stubs}:{os.environ['PATH']}", ARGV_LOG=str(log), DSPARK_PYTHON=str(stubs / "dspark-python"),
             NODE_RANK="0", DIST_INIT_ADDR="n0:5000", **env)
    p = subprocess.run(["bash", str(script)], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)
    return p.returncode, log.read_bytes().decode().split("\0")[:-1], p.stderr


def _no_pwned(*folders: Path) -> None:
    for folder in folders:
        assert not list(folder.rglob("PWNED*")), list(folder.rglob("PWNED*"))


def _after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_value_a_script_carries_is_inert_and_arrives_whole(variant, tmp_path):
    script, write, ctx = VARIANTS[variant]
    checked = 0
    for key in [*_hostile_keys(ctx), *COMMON]:
        folder = tmp_path / key
        folder.mkdir()
        common = {**COMMON, key: ALLOWED} if key in COMMON else COMMON
        context = ctx if key in COMMON else {**ctx, key: [ALLOWED] if isinstance(ctx[key], list) else ALLOWED}
        try:
            write(folder, context, common)
        except TunerError as e:  # a value the template needs inert (inside double quotes): refused, not written
            assert key in TOKEN_KEYS and "\n" not in str(e) and not (folder / script).exists(), (key, e)
            continue
        assert subprocess.run(["bash", "-n", str(folder / script)]).returncode == 0, key
        env = {} if key == "draft_path" else {"DRAFT_MODEL_PATH": "/env/drafter"}  # else: the default drafter
        code, argv, err = run(folder / script, folder, real_python3=key == "draft_path", **env)
        _no_pwned(tmp_path)
        checked += 1
        if variant == "vllm-rnn-head":  # vLLM cannot run this drafter: the script says so and stops
            assert code == 2 and not argv and "rnn head" in err, (key, err)
            continue
        assert code == 0, (key, err)
        if key == "model_path":
            assert (_after(argv, "--model-path") if script == "sglang.sh" else argv[2]) == ALLOWED
        if key == "draft_path" and script == "sglang.sh":
            assert _after(argv, "--speculative-draft-model-path") == ALLOWED
        if key == "draft_path" and ctx.get("needs_draft") and script == "vllm.sh":
            assert json.loads(_after(argv, "--speculative-config"))["model"] == ALLOWED
    assert checked >= len(COMMON) + 3


@pytest.mark.parametrize("char", sorted(REFUSED))
def test_a_line_breaking_character_in_any_value_is_refused_naming_its_option(char, tmp_path):
    bad = REFUSED[char]
    for script, write, ctx in VARIANTS.values():
        for key in [*_hostile_keys(ctx), *COMMON]:
            folder = tmp_path / f"{script}-{key}"
            folder.mkdir(exist_ok=True)
            common = {**COMMON, key: bad} if key in COMMON else COMMON
            context = ctx if key in COMMON else {**ctx, key: [bad] if isinstance(ctx[key], list) else bad}
            with pytest.raises(TunerError) as e:
                write(folder, context, common)
            line = str(e.value)
            assert "\n" not in line and "\r" not in line and line.isprintable(), (key, line)
            assert not (folder / script).exists()
            if key in OPTION:
                assert line.startswith(OPTION[key]), (key, line)


def test_dspark_sh_and_yaml_carry_hostile_names_as_comments_only(tmp_path):
    from tuner.engine_config import tuned_engine_config
    from tuner.objective import SimulateEvaluator

    params = _params()
    sps = SimulateEvaluator(profile(), n_requests=8, repeats=1).sps_table(params)
    for key in COMMON:
        folder = tmp_path / key
        folder.mkdir()
        config = tuned_engine_config(profile(), params, "some/drafter")
        write_dspark(folder, config, sps, {}, {**COMMON, key: ALLOWED})
        assert subprocess.run(["bash", "-n", str(folder / "dspark.sh")]).returncode == 0
        code, argv, err = run(folder / "dspark.sh", folder)
        assert code == 0 and argv[1:5] == ["-m", "cli", "serve", "--config"], err
        _no_pwned(tmp_path)
        with pytest.raises(TunerError, match="holds a newline"):
            write_dspark(folder, tuned_engine_config(profile(), params, "d"), sps, {}, {**COMMON, key: "a\nb"})


def test_script_templates_mark_every_value(tmp_path):
    """In a script template a value renders only through q, token or text (or as a number); text only in comments."""
    import jinja2

    for path in TEMPLATES.rglob("*.sh.j2"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for expr in re.findall(r"\{\{(.*?)\}\}", line):
                if "| text" in expr:
                    assert line.startswith("#"), f"{path.name}:{n}: text outside a comment"
    env = template_env()
    env.loader = jinja2.ChoiceLoader([jinja2.DictLoader({"probe.sh.j2": "echo {{ v }}\n"}), env.loader])
    with pytest.raises(TypeError, match="unmarked"):
        env.get_template("probe.sh.j2").render(v="x")
    assert env.get_template("probe.sh.j2").render(v=3) == "echo 3\n"
    assert env.get_template(DSPARK_TEMPLATES[1]).render(**COMMON)  # the shipped ones render


# --- refused where they enter: profile and tune ------------------------------------------------------------------




@pytest.mark.parametrize("char", sorted(REFUSED))
def test_tune_refuses_a_hostile_model_or_drafter_before_anything(char, tmp_path, capsys):
    bad = f"{tmp_path}/m{REFUSED[char]}x"
    out = str(tmp_path / "b")
    for option, argv in (("--model", ["tune", "--gpu", "h100", "--model", bad, "--out", out]),
                         ("--drafter", ["tune", "--gpu", "h100", "--model", "qwen3", "--drafter", bad, "--out", out])):
        line = refused(capsys, *argv)
        assert line.startswith(f"error: {option}") and "holds" in line, line
    assert not (tmp_path / "b").exists() and not (tmp_path / "kb.sqlite").exists()


def test_a_model_folder_named_with_a_newline_is_refused_by_profile_and_tune(tmp_path, capsys):
    import shutil

    from kb.db import open_db
    from kb.store import latest_profile

    folder = tmp_path / "m\ntouch PWNED_model_nl\nx"
    shutil.copytree(ASSETS / "target", folder)
    line = refused(capsys, "profile", "--model", str(folder), "--gpu", "h100")
    assert line.startswith("error: --model: the model folder's path holds a newline"), line
    assert latest_profile(open_db(None)) is None  # nothing stored
    link = tmp_path / "plain-name"
    link.symlink_to(folder)  # a plain name that resolves to the hostile folder: the scripts would carry the latter
    for argv in (["profile", "--model", str(link), "--gpu", "h100"],
                 ["tune", "--model", str(link), "--gpu", "h100", "--out", str(tmp_path / "b")]):
        assert "resolved path holds a newline" in refused(capsys, *argv)
    assert latest_profile(open_db(None)) is None and not (tmp_path / "b").exists()
    _no_pwned(tmp_path)


def test_a_study_name_with_a_line_separator_is_refused(tmp_path, capsys):
    line = refused(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--study", "a\u2028b", "--out",
                   str(tmp_path / "b"))
    assert "study name" in line
