"""dspark.yaml is what was tuned and runs in the bundled engine: the model it was tuned for, a KV length that holds
the workload, DSpark with the study's drafter (shipped in the engines' layout when measured), every value as tuned;
the report and the study carry units, the measured acceptance and metric names."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

import cli
from dspark_core.config import ASSETS, load_config


def _tune(tmp: Path, *profile_args: str, trials: str = "3", extra: tuple[str, ...] = ()) -> Path:
    import os

    os.environ["DSPARK_DB"] = f"sqlite:///{tmp / 'kb.sqlite'}"
    try:
        assert cli.main(["profile", *profile_args]) == 0
        assert cli.main(["tune", "--trials", trials, "--out", str(tmp / "b"), "--study", "s", *extra]) in (0, 2)
    finally:
        del os.environ["DSPARK_DB"]
    return tmp / "b"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    return _tune(tmp_path_factory.mktemp("sim"), "--model", "qwen3", "--gpu", "h100")


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    # the drafter given: DSpark fixed (a measured study otherwise searches plain, n-gram, suffix and the hybrid too)
    return _tune(tmp_path_factory.mktemp("cpu"), "--model", "tiny", "--gpu", "cpu", "--slo-tpot-ms", "0",
                 "--slo-ttft-ms", "0", "--drafter", str(ASSETS / "drafters" / "markov"), trials="2",
                 extra=("--trial-seconds", "20", "--no-compile"))  # a compiled bundle: test_measure_compiled.py


def test_simulated_bundle_names_the_model_and_its_published_drafter(simulated):
    cfg = load_config(simulated / "dspark.yaml")
    prov = json.loads((simulated / "provenance.json").read_text())
    p = prov["params"]
    assert cfg.model.path == "Qwen/Qwen3-8B"  # a model id, never the catalogue's web address
    assert cfg.drafter.method == "dspark" and cfg.drafter.path == "deepseek-ai/dspark_qwen3_8b_block7"
    assert cfg.model.max_seq_len >= 4096 + 1024 + p["spec.block_size"]  # the chat preset's p99 prompt + output
    assert cfg.weights.dtype == p["weights.dtype"] and cfg.kv.dtype == p["kv.dtype"]
    assert cfg.spec.block_size == p["spec.block_size"] <= 7 and cfg.spec.head == "markov"  # the drafter's
    assert p["spec.draft_layers"] == 5 and cfg.batch.max_requests == p["batch.max_requests"]  # the checkpoint's
    assert "draft_layers" not in cfg.spec.model_dump() and "markov_rank" not in cfg.spec.model_dump()  # not flags
    assert cfg.memory.page_size == p["memory.page_size"] and cfg.parallel.tp == p["parallel.tp"]


def test_simulated_scripts_carry_every_tuned_value(simulated):
    p = json.loads((simulated / "provenance.json").read_text())["params"]
    sg, vl = (simulated / "sglang.sh").read_text(), (simulated / "vllm.sh").read_text()
    assert f"--page-size {p['memory.page_size']}" in sg and f"--max-prefill-tokens {p['batch.max_tokens']}" in sg
    assert f"--block-size {p['memory.page_size']}" in vl and f"--max-num-batched-tokens {p['batch.max_tokens']}" in vl
    util = float(vl.split("--gpu-memory-utilization ")[1].split()[0])
    assert p["memory.fraction_static"] < util <= 0.98  # vLLM's fraction also covers activations
    if p["weights.dtype"] != "auto":
        assert "--speculative-draft-model-quantization unquant" in sg  # the bf16 draft must not inherit fp8


def test_measured_bundle_ships_its_drafter_and_runs_in_the_engine(measured):
    from dspark_core.engine import Engine
    from dspark_core.verification.sampling import SamplingParams

    cfg = load_config(measured / "dspark.yaml")
    prov = json.loads((measured / "provenance.json").read_text())
    assert cfg.drafter.method == "dspark" and Path(cfg.drafter.path) == measured / "drafter"
    assert json.loads((measured / "drafter" / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    assert Path(cfg.model.path) == (ASSETS / "target").resolve() and cfg.device == "auto"
    tuned = prov["params"]
    assert cfg.spec.head == tuned["spec.head"] and cfg.batch.max_requests == tuned["batch.max_requests"]
    raw = yaml.safe_load((measured / "dspark.yaml").read_text())
    assert raw["drafter"]["path"] == "drafter"  # relative: the bundle can move
    cfg.batch.max_requests = 2
    cfg.sampling = SamplingParams(max_new_tokens=24)
    prompts = ["def parse(text):\n    ", "import os\n"]
    as_tuned = Engine(cfg).generate(prompts)  # the tuned scheduler learns its round overhead from the clock
    cfg.spec.scheduler = "verify_all"  # deterministic verify lengths: drafts and acceptance comparable one to one
    shipped = Engine(cfg).generate(prompts)
    cfg.drafter.path = str(ASSETS / "drafters" / cfg.spec.head)  # the committed drafter it was copied from
    original = Engine(cfg).generate(prompts)
    assert [o.token_ids for o in shipped.outputs] == [o.token_ids for o in original.outputs] == \
        [o.token_ids for o in as_tuned.outputs]  # lossless greedy: the same text whatever the scheduler
    assert (shipped.stats.accepted, shipped.stats.pos_accepts) == (original.stats.accepted, original.stats.pos_accepts)


def test_measured_report_shows_what_was_measured(measured):
    report = (measured / "report.md").read_text()
    assert "Acceptance model: measured: trial" in report and "tok/s/GPU" in report
    assert "throughput (tok/s/GPU)" in report  # objectives with units
    from kb.db import resolve_url  # noqa: F401 - the study lives in the fixture's database
    from tuner.study import storage

    url = f"sqlite:///{measured.parent / 'kb.sqlite'}"
    study = optuna.load_study(study_name="s", storage=storage(url))
    assert study.metric_names == ["throughput (tok/s/GPU)", "p99 TPOT (ms)"]
    assert any(t.user_attrs.get("position_acceptance") for t in study.trials)
