"""tune-kernels on a CPU: the Optuna wiring, KB storage and lookup with a fake timer (no timings)."""

from __future__ import annotations

import dataclasses
import json
import math

import optuna
import pytest

import cli
from dspark_core.kernels import registry
from dspark_core.kernels import spec as kspec
from kb.db import open_db
from tuner import kernels as kt
from tuner.errors import TunerError


class FakeTimer:
    """Time = distance of each knob from a chosen optimum (in steps of its choice list); some knob values
    are 'invalid on this GPU' (inf). Records every call."""

    def __init__(self, optimum: dict[str, dict[str, int]], invalid: dict[str, int] | None = None) -> None:
        self.optimum, self.invalid, self.calls = optimum, invalid or {}, []

    def __call__(self, kernel: str, shape: dict[str, int], config: dict[str, int]) -> float:
        self.calls.append((kernel, dict(config)))
        space = registry.get_entry(kernel).spec.space
        if any(config.get(k) == v for k, v in self.invalid.items()):
            return math.inf
        opt = self.optimum[kernel]
        return 1.0 + sum(abs(space[k].index(config[k]) - space[k].index(opt[k])) for k in space)


SWIGLU_OPT = {"BLOCK": 512, "num_warps": 2, "num_stages": 2}
NORM_OPT = {"BLOCK_H": 2048, "num_warps": 16, "num_stages": 1}


@pytest.fixture(autouse=True)
def _clean() -> None:
    kspec.clear_tuned()
    yield
    kspec.clear_tuned()


def test_study_finds_the_optimum_and_prunes_invalid_configs() -> None:
    job = kt.default_jobs(["swiglu"], [4], gamma=3, vocab=100, hidden=64, inter=300, rank=8)[0]
    timer = FakeTimer({"swiglu": SWIGLU_OPT}, invalid={"num_warps": 16})
    res = kt.tune_kernel(job, timer, gpu="fake-gpu", arch="hopper", n_trials=40, seed=0)
    assert res.config == SWIGLU_OPT and res.time_ms == 1.0
    # trial 0 is the architecture default, so the winner is never worse than it
    default = registry.get_entry("swiglu").spec.defaults["hopper"]
    assert timer.calls[0] == ("swiglu", default)
    assert res.default_ms == timer(*("swiglu", job.shape, default)) >= res.time_ms
    measured = [c for _, c in timer.calls[:-1]]
    assert len(measured) == len({tuple(sorted(c.items())) for c in measured})  # repeats are not re-timed
    assert any(c["num_warps"] == 16 for c in measured) and res.config["num_warps"] != 16  # pruned, never won
    assert res.n_trials == 40


def test_plan_narrows_the_space() -> None:
    """kernel.* rules from a KB plan: fixed, range (declared values inside it) and prefer."""
    plan = {"fixed": {"kernel.swiglu.num_stages": {"value": 1, "rules": ["r1"], "why": ""}},
            "space": {"kernel.swiglu.BLOCK": {"kind": "range", "low": 2048, "high": 4096, "type": "int",
                                              "rules": ["r2"], "why": ""},
                      "kernel.swiglu.num_warps": {"kind": "range", "low": 4, "high": 16, "type": "int",
                                                  "rules": ["r3"], "why": ""}},
            "prefer": {"kernel.swiglu.num_warps": {"value": 16, "rules": ["r3"]}}}
    space, start = kt.plan_space("swiglu", plan)
    assert space == {"BLOCK": (2048, 4096), "num_warps": (4, 8, 16), "num_stages": (1,)}
    assert start == {"num_warps": 16}
    job = kt.default_jobs(["swiglu"], [4], gamma=3, vocab=100, hidden=64, inter=300, rank=8)[0]
    timer = FakeTimer({"swiglu": SWIGLU_OPT})  # its optimum lies outside the plan
    res = kt.tune_kernel(job, timer, gpu="g", arch="default", n_trials=12, space=space, start=start)
    assert timer.calls[0][1] == {"BLOCK": 2048, "num_warps": 16, "num_stages": 1}  # default moved inside
    assert all(c["BLOCK"] in (2048, 4096) and c["num_stages"] == 1 for _, c in timer.calls)
    assert res.config == {"BLOCK": 2048, "num_warps": 4, "num_stages": 1}  # best reachable point
    bad = {"space": {"kernel.swiglu.BLOCK": {"kind": "range", "low": 5000, "high": 6000, "rules": ["r9"]}}}
    with pytest.raises(TunerError, match="r9"):
        kt.plan_space("swiglu", bad)


def test_all_configs_invalid_is_a_user_error() -> None:
    job = kt.default_jobs(["swiglu"], [1], gamma=1, vocab=10, hidden=8, inter=8, rank=4)[0]
    with pytest.raises(TunerError, match="no valid config"):
        kt.tune_kernel(job, lambda *_: math.inf, gpu="g", arch="default", n_trials=3)


def test_store_lookup_and_engine_resolution(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    db = open_db(url)
    jobs = kt.default_jobs(["swiglu", "rmsnorm"], [1, 3, 4], gamma=3, vocab=100, hidden=64, inter=300, rank=8)
    assert sorted(j.bucket for j in jobs if j.kernel == "rmsnorm") == ["N16-H64", "N4-H64"]  # 3, 4 share one
    gpu = kt.gpu_key("NVIDIA Fake GPU 80GB")
    timer = FakeTimer({"swiglu": SWIGLU_OPT, "rmsnorm": NORM_OPT})
    results = kt.run_tuning(jobs, timer, gpu=gpu, arch="hopper", n_trials=30, db=db, triton_version="3.x",
                            storage=url, torch_timer=lambda kernel, shape: 5.0)
    table = kt.lookup_kernel_configs(db, "NVIDIA Fake GPU 80GB")
    assert set(table) == {"swiglu", "rmsnorm"}
    assert {b for b in table["rmsnorm"]} == {j.bucket for j in jobs if j.kernel == "rmsnorm"}
    for r in results:
        assert table[r.kernel][r.bucket] == r.config
        assert r.speedup_vs_torch() == 5.0 / r.time_ms
    assert kt.lookup_kernel_configs(db, "another-gpu") == {}
    assert kt.lookup_kernel_configs(db, gpu, kernels=["swiglu"]).keys() == {"swiglu"}
    # the Optuna studies live on the same URL and resume by name
    names = {s.study_name for s in optuna.get_all_study_summaries(storage=url)}
    assert any(name.startswith(f"kernels/{gpu}/swiglu/{jobs[0].bucket}/") for name in names)
    # re-tuning updates rows in place (one row per kernel, gpu, bucket)
    better = {"BLOCK": 4096, "num_warps": 8, "num_stages": 1}
    kt.run_tuning(jobs[:1], FakeTimer({"swiglu": better}), gpu=gpu, arch="hopper", n_trials=30, db=db,
                  triton_version="3.x", storage=None)
    again = kt.lookup_kernel_configs(db, gpu)
    assert again["swiglu"][jobs[0].bucket] == better and len(again["rmsnorm"]) == 2
    # the engine path: the bundle's table goes into the kernels' config resolution
    bundle = tmp_path / "kernels.json"
    bundle.write_text(json.dumps(kt.kernels_json(db, "NVIDIA Fake GPU 80GB")))
    assert kspec.load_tuned_file(bundle, "cpu")
    entry = registry.get_entry("swiglu")
    assert kspec.resolve_config(entry.spec, entry.bucket(jobs[0].shape), "cpu") == better
    bundle.write_text("{not json")
    with pytest.raises(ValueError, match="kernels.json"):
        kspec.load_tuned_file(bundle)


def test_dobench_timer_checks_against_the_reference(monkeypatch) -> None:
    """The real timer's path on CPU (interpreter, injected clock): valid -> clock value, wrong -> inf."""
    ticks = []
    timer = kt.DoBenchTimer("cpu", bench=lambda fn: (fn(), ticks.append(1), 0.25)[2])
    shape = {"rows": 3, "hidden": 40}
    cfg = dict(registry.get_entry("rmsnorm").spec.defaults["default"])
    assert timer("rmsnorm", shape, cfg) == 0.25 and len(ticks) == 1
    assert timer.torch_ms("rmsnorm", shape) == 0.25
    real = registry.get_entry

    def broken(name: str) -> registry.KernelEntry:
        def fail(out, ref, inputs) -> None:
            raise AssertionError("wrong answer")
        return dataclasses.replace(real(name), check=fail)

    monkeypatch.setattr(registry, "get_entry", broken)
    assert timer("rmsnorm", shape, cfg) == math.inf


@pytest.mark.parametrize("argv, needle", [
    (["tune-kernels"], "needs a CUDA GPU"),
    (["tune-kernels", "--kernels", "verify_greedy,softmax"], "unknown kernel(s) softmax"),
    (["tune-kernels", "--batch", "1,x"], "--batch"),
])
def test_cli_user_errors(argv: list[str], needle: str, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def test_cli_end_to_end_with_a_fake_gpu(tmp_path, monkeypatch, capsys) -> None:
    """The command's wiring (options, study per bucket, JSON, storage) with the GPU and clock faked."""
    class FakeBench:
        def __init__(self, device: str, seed: int = 0) -> None:
            self.timer = FakeTimer({"swiglu": SWIGLU_OPT, "rmsnorm": NORM_OPT})

        def __call__(self, kernel: str, shape: dict[str, int], config: dict[str, int]) -> float:
            return self.timer(kernel, shape, config)

        def torch_ms(self, kernel: str, shape: dict[str, int]) -> float:
            return 4.0

    monkeypatch.setattr(kt, "local_gpu", lambda: ("nvidia-fake-gpu", "NVIDIA Fake GPU"))
    monkeypatch.setattr(kt, "DoBenchTimer", FakeBench)
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    argv = ["tune-kernels", "--kernels", "swiglu", "--kernels", "rmsnorm", "--batch", "1,64", "--trials", "30",
            "--hidden", "64", "--inter", "300", "--db", url, "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu"] == "NVIDIA Fake GPU" and len(report["results"]) == 4  # 2 kernels x 2 buckets
    assert {r["kernel"]: r["config"] for r in report["results"]} == {"swiglu": SWIGLU_OPT, "rmsnorm": NORM_OPT}
    assert all(r["speedup_vs_torch"] == 4.0 for r in report["results"])
    stored = kt.lookup_kernel_configs(open_db(url), "NVIDIA Fake GPU")
    assert {k: len(v) for k, v in stored.items()} == {"swiglu": 2, "rmsnorm": 2}
