"""The tuned draft length per batch size (tuner/method_schedule.py) as the bundle exports it: vLLM's
num_speculative_tokens_per_batch_size, SGLang's --speculative-adaptive-config for EAGLE3 / NEXTN, and what the
released engines' own loaders make of them.

The released parsers run here when their code is at hand: `DSPARK_PEER_SITE` (a folder holding the unpacked
sglang 0.5.23 and vllm 0.33.0 packages, e.g. a site-packages) or the interop check's peer venv in the user cache;
benchmarks/interop_check.py runs whole bundles through both engines' server parsers."""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from profiler.schema import Profile
from tests.tuner.fixtures import QWEN3_8B_H100
from tuner.launch import SGLANG_TEMPLATE, VLLM_TEMPLATES, template_env, write_sglang
from tuner.method_schedule import operating_batch, pin, tuned_schedule
from tuner.space import engine_defaults
from tuner.targets import sglang_context, vllm_context

DRAFTER = {"id": "deepseek-ai/dspark_qwen3_8b_block7", "method": "dspark", "heads": ["markov"], "layers": 5,
           "block_size": 7, "checkpoint": "deepseek-ai/dspark_qwen3_8b_block7",
           "available": ["dspark", "eagle3", "ngram", "suffix", "none"]}
COMMON = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H100-SXM", "model_name": "Qwen3-8B"}


def _profile() -> Profile:
    return Profile.model_validate({**QWEN3_8B_H100, "drafter": DRAFTER})


def _params(**kw: Any) -> dict[str, Any]:
    return {**engine_defaults(), "spec.block_size": 5, "batch.max_requests": 256, "batch.max_tokens": 8192,
            "spec.head": "markov", "spec.draft_layers": 5, "parallel.tp": 1, **kw}


def test_pin_keeps_the_tuned_k_up_to_the_tuned_load_and_never_grows():
    assert pin([[1, 8, 5], [9, 64, 3], [65, 256, 0]], 16, 5) == [[1, 16, 5], [17, 64, 3], [65, 256, 0]]
    assert pin([[1, 256, 2]], 16, 5) == [[1, 16, 5], [17, 256, 2]]
    assert pin([[1, 4, 5], [5, 256, 1]], 256, 5) == [[1, 256, 5]]


@pytest.fixture(scope="module")
def schedule() -> list[list[int]]:
    from tuner.objective import SimulateEvaluator

    ev = SimulateEvaluator(_profile(), n_requests=24, repeats=1)
    return tuned_schedule(ev, _params(**{"spec.method": "eagle3"}), "vllm")


def test_the_schedule_covers_every_batch_from_1_with_the_tuned_k_at_the_load(schedule):
    assert schedule[0][0] == 1 and schedule[-1][1] == 256
    assert all(a[1] + 1 == b[0] for a, b in zip(schedule, schedule[1:], strict=False))  # contiguous, no overlap
    ks = [k for _, _, k in schedule]
    assert ks == sorted(ks, reverse=True) and max(ks) == 5  # never longer under more load, never past the tuned K
    load = operating_batch(_profile(), _params())
    assert load == 16 and next(k for lo, hi, k in schedule if lo <= load <= hi) == 5
    assert len(schedule) > 1  # 256 running requests of an 8B model on one H100: the draft shortens


def test_simulated_studies_only():
    class Measured:
        mode = "measure"

    assert tuned_schedule(Measured(), _params(), "vllm") is None


def test_vllm_json_carries_the_schedule_where_vllm_keeps_it(schedule):
    env = template_env()

    def spec(**kw: Any) -> dict[str, Any]:
        ctx = vllm_context(_profile(), _params(**kw), max_seq_len=4096, schedule=schedule)
        return json.loads(env.get_template(VLLM_TEMPLATES[0]).render(**COMMON, **ctx))

    s = spec(**{"spec.method": "eagle3"})
    assert s["method"] == "eagle3" and s["model"] == "deepseek-ai/eagle3_qwen3_8b_ttt7"  # the published EAGLE-3 head
    assert s["num_speculative_tokens_per_batch_size"] == schedule and s["num_speculative_tokens"] == 5
    assert "num_speculative_tokens_per_batch_size" not in spec(**{"spec.method": "suffix"})  # V1 would drop it
    assert "num_speculative_tokens_per_batch_size" not in spec(**{"spec.method": "ngram", "parallel.dp": 2})


def test_sglang_runs_the_schedule_as_its_adaptive_config(schedule, tmp_path):
    ctx = sglang_context(_profile(), _params(**{"spec.method": "eagle3"}), max_seq_len=4096, schedule=schedule)
    write_sglang(tmp_path, ctx, COMMON)
    sh = (tmp_path / "sglang.sh").read_text()
    assert "--speculative-algorithm EAGLE3" in sh and "--speculative-adaptive \\" in sh
    assert '--speculative-adaptive-config "$here/sglang_adaptive.json"' in sh
    assert "--speculative-num-draft-tokens" not in sh  # SGLang derives them from the steps when adaptive
    cfg = json.loads((tmp_path / "sglang_adaptive.json").read_text())
    assert sorted(int(k) for k in cfg) == [lo for lo, _, _ in schedule]
    assert 5 in cfg["1"]["candidate_steps"] and "--speculative-num-steps 5" in sh
    static = sglang_context(_profile(), _params(**{"spec.method": "eagle3"}), max_seq_len=4096)
    sh = template_env().get_template(SGLANG_TEMPLATE).render(**COMMON, **static)
    assert "--speculative-adaptive" not in sh and "--speculative-num-draft-tokens 6" in sh


def test_sglang_has_no_schedule_for_dspark_and_no_suffix_at_all(schedule):
    env = template_env()
    dspark = env.get_template(SGLANG_TEMPLATE).render(**COMMON, **sglang_context(
        _profile(), _params(**{"spec.method": "dspark"}), max_seq_len=4096, schedule=schedule))
    assert "--speculative-algorithm DSPARK" in dspark and "--speculative-adaptive" not in dspark
    suffix = env.get_template(SGLANG_TEMPLATE).render(**COMMON, **sglang_context(
        _profile(), _params(**{"spec.method": "suffix"}), max_seq_len=4096))
    assert "exit 2" in suffix and "use vllm.sh" in suffix


# ---- the released engines' own loaders (skipped when their code is not here)

def _peer_site() -> Path | None:
    cands = [os.environ.get("DSPARK_PEER_SITE") or ""]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dspark-tune" / "interop" / "venv"
    cands += glob.glob(str(cache / "lib" / "python*" / "site-packages"))
    return next((Path(c) for c in cands if c and (Path(c) / "sglang").is_dir() and (Path(c) / "vllm").is_dir()), None)


PEER = _peer_site()
released = pytest.mark.skipif(PEER is None, reason="set DSPARK_PEER_SITE to the unpacked sglang 0.5.23 / vllm 0.33.0")


def _vllm_utils():
    """vllm/v1/spec_decode/dynamic/utils.py as released (it imports nothing)."""
    spec = importlib.util.spec_from_file_location("vllm_dynamic_sd", PEER / "vllm/v1/spec_decode/dynamic/utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sglang_functions(*names: str) -> dict[str, Any]:
    """The named functions of sglang/srt/speculative/adaptive_spec_params.py as released, run on their own (they
    use only json; the module's other imports need SGLang's runtime)."""
    src = (PEER / "sglang/srt/speculative/adaptive_spec_params.py").read_text()
    tree = ast.parse(src)
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in body} == set(names)
    ns: dict[str, Any] = {"json": json}
    exec(compile(ast.Module(body=body, type_ignores=[]), "adaptive_spec_params.py", "exec",  # noqa: S102
                 flags=__import__("__future__").annotations.compiler_flag), ns)
    return ns


@released
def test_vllm_0_33_accepts_the_exported_schedule(schedule):
    u = _vllm_utils()
    assert u.validate_and_normalize_dynamic_sd_schedule(schedule) == [tuple(r) for r in schedule]
    dense = u.build_dynamic_sd_schedule_lookup(schedule, 256, 5)
    assert dense[1] == 5 and dense[256] == schedule[-1][2] and dense[16] == 5
    with pytest.raises(ValueError):  # the check has teeth: the PR's dict form is refused
        u.validate_and_normalize_dynamic_sd_schedule({"1-16": 3})


@released
def test_sglang_0_5_23_loads_the_exported_adaptive_config(schedule, tmp_path):
    ctx = sglang_context(_profile(), _params(**{"spec.method": "eagle3"}), max_seq_len=4096, schedule=schedule)
    write_sglang(tmp_path, ctx, COMMON)
    f = _sglang_functions("_load_adaptive_config", "resolve_candidate_steps_from_config")
    _, slots = f["_load_adaptive_config"](str(tmp_path / "sglang_adaptive.json"))
    assert sorted(slots) == [lo for lo, _, _ in schedule]
    steps = f["resolve_candidate_steps_from_config"](str(tmp_path / "sglang_adaptive.json"))
    assert ctx["steps"] in steps  # what _init_adaptive_speculative_params requires of --speculative-num-steps
    (tmp_path / "flat.json").write_text(json.dumps({"candidate_steps": [1, 3, 7]}))  # the docs' flat form: refused
    with pytest.raises(ValueError):
        f["_load_adaptive_config"](str(tmp_path / "flat.json"))


@released
def test_method_names_are_the_released_ones():
    from tuner.spec_targets import SGLANG_ALGORITHM

    src = (PEER / "sglang/srt/speculative/spec_info.py").read_text()
    enum = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    members = {t.id for n in enum.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    aliases = (PEER / "sglang/srt/speculative/spec_registry.py").read_text()
    assert all(a in members or f'"{a}"' in aliases for a in SGLANG_ALGORITHM.values())
    vllm = (PEER / "vllm/config/speculative.py").read_text()
    for m in ("dspark", "dflash", "eagle3", "mtp", "draft_model", "ngram", "suffix"):
        assert f'"{m}"' in vllm
