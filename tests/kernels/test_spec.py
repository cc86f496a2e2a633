"""Config resolution (override > tuned > arch default), backend choice, and the registry entries."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels import spec as kspec
from dspark_core.kernels.registry import KERNEL_NAMES, get_entry
from dspark_core.kernels.rmsnorm import SPEC as NORM

SMALL = {"verify_greedy": {"batch": 3, "gamma": 2, "vocab": 70},
         "verify_sample": {"batch": 3, "gamma": 2, "vocab": 70},
         "markov_head": {"batch": 3, "vocab": 70, "rank": 20},
         "rmsnorm": {"rows": 3, "hidden": 70}, "swiglu": {"rows": 3, "inter": 70}}


@pytest.fixture(autouse=True)
def _clean_table() -> None:
    kspec.clear_tuned()
    yield
    kspec.clear_tuned()
    kspec.set_backend("auto")


def test_resolution_order() -> None:
    bucket = "N4-H70"
    assert kspec.resolve_config(NORM, bucket, "cpu") == NORM.defaults["default"]
    tuned = {"BLOCK_H": 1024, "num_warps": 2, "num_stages": 2}
    kspec.load_tuned({"rmsnorm": {bucket: tuned}})
    assert kspec.resolve_config(NORM, bucket, "cpu") == tuned
    assert kspec.resolve_config(NORM, "N8-H70", "cpu") == NORM.defaults["default"]  # other bucket
    override = {"BLOCK_H": 0, "num_warps": 1, "num_stages": 1}
    assert kspec.resolve_config(NORM, bucket, "cpu", override) == override
    assert kspec.tuned_table() == {"rmsnorm": {bucket: tuned}}


def test_engine_params_apply_to_every_shape_under_bucket_entries() -> None:
    kspec.load_engine_params({"rmsnorm": {"num_warps": 16}})  # partial: the rest from the arch default
    assert kspec.resolve_config(NORM, "N4-H70", "cpu") == {**NORM.defaults["default"], "num_warps": 16}
    exact = {"BLOCK_H": 2048, "num_warps": 1, "num_stages": 2}
    kspec.load_tuned({"rmsnorm": {"N4-H70": exact}})
    assert kspec.resolve_config(NORM, "N4-H70", "cpu") == exact  # a tuned bucket beats the wildcard
    kspec.load_engine_params({"rmsnorm": {"num_warps": 5}})  # not in the space: ignored, not an error
    assert kspec.resolve_config(NORM, "N8-H70", "cpu") == NORM.defaults["default"]


def test_stale_tuned_entry_is_ignored_and_bad_override_rejected() -> None:
    kspec.load_tuned({"rmsnorm": {"N4-H70": {"BLOCK_H": 999, "num_warps": 2, "num_stages": 1}}})
    assert kspec.resolve_config(NORM, "N4-H70", "cpu") == NORM.defaults["default"]
    with pytest.raises(ValueError, match="num_warps=3"):
        kspec.resolve_config(NORM, "N4-H70", "cpu", {"BLOCK_H": 0, "num_warps": 3, "num_stages": 1})


def test_backend_choice() -> None:
    t = torch.zeros(1)
    assert not kspec.use_triton(t)  # auto on CPU -> torch
    assert kspec.use_triton(t, "triton")
    kspec.set_backend("triton")
    assert kspec.use_triton(t)
    assert not kspec.use_triton(t, "torch")
    with pytest.raises(ValueError, match="cuda"):
        kspec.set_backend("cuda")
    assert kspec.gpu_arch("cpu") == "cpu"
    assert kspec.pow2_ceil(1) == 1 and kspec.pow2_ceil(151936) == 262144


def test_every_spec_is_consistent() -> None:
    for name in KERNEL_NAMES:
        entry = get_entry(name)
        assert entry.spec.name == name
        for cfg in entry.spec.defaults.values():
            entry.spec.validate(cfg)
        assert entry.bytes_moved(SMALL[name]) > 0
    with pytest.raises(ValueError, match="unknown kernel"):
        get_entry("softmax")


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_entry_runs_and_checks(name: str) -> None:
    """The tuner's path: build inputs, run Triton with a non-default config, check against the reference."""
    entry = get_entry(name)
    inp = entry.make_inputs(SMALL[name], "cpu", 1)
    cfg = {k: v[0] for k, v in entry.spec.space.items()}  # smallest point of the space
    entry.check(entry.run_triton(inp, cfg), entry.run_torch(inp), inp)
    assert entry.bucket(SMALL[name])
