"""The fuzz targets of benchmarks/fuzz/ without atheris: each crash input atheris found (kept in
`benchmarks/fuzz/crashes/<target>/` once its bug was fixed) replays through `fuzz_one` without escaping, and each
target's seeds are inputs its readers accept, so the fuzzer starts from valid files."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz"
TARGETS = sorted(p.stem.removeprefix("target_") for p in FUZZ.glob("target_*.py"))
sys.path.insert(0, str(FUZZ))


def target(name: str):  # noqa: ANN201 - the target module
    return importlib.import_module(f"target_{name}")


CRASHES = sorted((t, p) for t in TARGETS for p in (FUZZ / "crashes" / t).glob("*") if p.is_file())


@pytest.mark.parametrize("name, path", CRASHES, ids=[f"{t}/{p.name}" for t, p in CRASHES])
def test_a_crash_atheris_found_stays_fixed(name: str, path: Path) -> None:
    target(name).fuzz_one(path.read_bytes())  # a reader's one-line user error is swallowed; anything else fails


def test_every_target_follows_the_convention() -> None:
    assert {"config_json", "safetensors_header", "gguf"} <= set(TARGETS)
    for name in TARGETS:
        mod = target(name)
        assert mod.SEEDS and all(isinstance(s, bytes) and len(s) <= getattr(mod, "MAX_LEN", 4096) for s in mod.SEEDS)
        assert callable(mod.fuzz_one)


def test_the_seeds_are_inputs_the_readers_accept() -> None:
    from dspark_core.modeling.arch import ArchConfig
    from dspark_core.modeling.gguf_convert import read_gguf_model
    from dspark_core.modeling.weights import read_header
    from profiler.arch import read_config
    from profiler.build import read_json

    scratch = importlib.import_module("scratch")
    config = target("config_json")
    accepted = 0
    for seed in config.SEEDS:
        path = scratch.write("config.json", seed, "seeds")
        if b"weight_map" not in seed:
            read_config(read_json(path), str(path))
            accepted += 1
    ArchConfig.from_file(scratch.write("config.json", config.SEEDS[0], "seeds"))
    st = target("safetensors_header")
    for seed in st.SEEDS:
        read_header(scratch.write("model.safetensors", st.frame(seed)))
    for seed in target("gguf").SEEDS:
        assert read_gguf_model(scratch.write("model.gguf", seed)).arch.num_hidden_layers == 1
    assert accepted >= 10
