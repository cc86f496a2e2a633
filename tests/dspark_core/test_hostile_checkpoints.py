"""Hostile model and drafter folders through the real entry points (`cli.main` in process: generate, profile, serve,
bench, and a drafter through an engine config): exit code 2, one `error:` line naming the file, no traceback, and
nothing outside the folder opened (Python's `open` audit events and the safetensors loader's calls are watched).

Each case copies the tiny reference target (or its markov drafter) into tmp_path and corrupts one thing.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import cli
from dspark_core.paths import ASSETS

TARGET = ASSETS / "target"
DRAFTER = ASSETS / "drafters" / "markov"
OPENED: list[str] = []  # paths Python opened while a case ran (audit hook below)
WATCH = {"on": False}


def _audit(event: str, args: tuple) -> None:
    """Record paths opened for reading (the test's own copying writes)."""
    if WATCH["on"] and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        mode = args[1] if isinstance(args[1], str) else ""
        flags = args[2] if isinstance(args[2], int) else 0
        if not set(mode) & set("wax") and not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # cannot be removed: it only records while WATCH is on


@pytest.fixture
def watch(monkeypatch):
    """Record every file Python opens and every file safetensors' (Rust) loader is asked to read."""
    import safetensors.torch

    real = safetensors.torch.load_file

    def spy(path, *a, **k):  # noqa: ANN001, ANN202 - the library's signature
        OPENED.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(safetensors.torch, "load_file", spy)
    OPENED.clear()
    WATCH["on"] = True
    yield OPENED
    WATCH["on"] = False


def copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def header_of(path: Path) -> tuple[dict, bytes]:
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def one_line_error(capsys, argv: list[str]) -> str:
    """The run's stderr when it is exactly one `error:` line with exit code 2 (an exception escaping cli.main
    would fail the test with its traceback)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def generate(folder: Path) -> list[str]:
    return ["generate", "--model", str(folder), "--prompt", "def f", "--max-new-tokens", "2"]


def profile(folder: Path) -> list[str]:
    return ["profile", "--model", str(folder), "--no-store"]


# -- config.json: the engine (generate) and the profiler (profile) read it the same way -------------------------------
def _raw(text: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / "config.json").write_bytes(text)


def _set(**changes: object) -> Callable[[Path], None]:
    return lambda folder: edit_config(folder, **changes)


CONFIG_CASES = [  # id, corruption, words the line must hold (besides the file)
    ("absurd-vocab", _set(vocab_size=2**40), "vocab_size"),
    ("negative-hidden", _set(hidden_size=-192), "hidden_size"),
    ("zero-heads", _set(num_attention_heads=0), "num_attention_heads"),
    ("float-layers", _set(num_hidden_layers=4.5), "num_hidden_layers"),
    ("string-vocab", _set(vocab_size="4096"), "vocab_size"),
    ("kv-heads-not-dividing", _set(num_key_value_heads=4), "num_key_value_heads"),
    ("heads-not-dividing-hidden", _set(head_dim=None, num_attention_heads=5), "num_attention_heads"),
    ("string-rope-scaling", _set(rope_scaling="llama3"), "rope_scaling"),
    ("incomplete-llama3-scaling", _set(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
    ("list-rope-parameters", _set(rope_parameters=[1, 2]), "rope_parameters"),
    ("nan-eps", _raw(TARGET.joinpath("config.json").read_bytes().replace(b'"rms_norm_eps": 1e-06',
                                                                           b'"rms_norm_eps": NaN')), "rms_norm_eps"),
    ("json-list", _raw(b"[1, 2, 3]"), "object"),
    ("deep-nesting", _raw(b"[" * 100_000), "deeply"),
    ("not-utf8", _raw(b'{"model_type": "\xff\xfe"}'), "config.json"),
]


@pytest.mark.parametrize("command", [generate, profile], ids=["generate", "profile"])
@pytest.mark.parametrize("corrupt, needle", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_a_hostile_config_is_one_line_naming_the_file(capsys, tmp_path, command, corrupt, needle) -> None:
    folder = copy(TARGET, tmp_path / "model")
    corrupt(folder)
    line = one_line_error(capsys, command(folder))
    assert str(folder) in line and needle in line, line


def test_sizes_in_bounds_that_do_not_fit_in_memory_are_refused_with_the_estimate(capsys, tmp_path) -> None:
    folder = copy(TARGET, tmp_path / "model")
    edit_config(folder, vocab_size=2**24, hidden_size=65536, intermediate_size=2**20, num_hidden_layers=1024)
    line = one_line_error(capsys, generate(folder))
    assert "needs about" in line and "target weights" in line and "free" in line and str(folder) in line, line


def test_a_kv_cache_that_does_not_fit_names_what_to_lower(capsys, tmp_path) -> None:
    cfg = tmp_path / "dspark.yaml"
    cfg.write_text(f"device: cpu\nmodel:\n  path: {TARGET}\n  max_seq_len: 1000000000\nbatch:\n  max_requests: 4096\n"
                   "drafter:\n  method: plain\n")
    line = one_line_error(capsys, ["generate", "--config", str(cfg), "--prompt", "x"])
    assert "KV cache" in line and "model.max_seq_len" in line and "batch.max_requests" in line, line


# -- weights: headers, pickles, index files and links -----------------------------------------------------------------
def _pickle(folder: Path) -> None:
    import torch

    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2)}, folder / "model.safetensors")


def _pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def _header_length(folder: Path) -> None:
    path = folder / "model.safetensors"
    blob = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**40) + blob[8:])


def _offsets_beyond(folder: Path) -> None:
    path = folder / "model.safetensors"
    header, data = header_of(path)
    name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    header[name]["data_offsets"][1] += 1 << 30
    write_safetensors(path, header, data)


def _shape_lies(folder: Path) -> None:
    path = folder / "model.safetensors"
    header, data = header_of(path)
    header["model.norm.weight"]["shape"] = [1 << 20]
    write_safetensors(path, header, data)


def _header_not_json(folder: Path) -> None:
    path = folder / "model.safetensors"
    blob = path.read_bytes()
    path.write_bytes(blob[:8] + b"}" + blob[9:])


def _truncated(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _missing_tensor(folder: Path) -> None:
    path = folder / "model.safetensors"
    header, data = header_of(path)
    del header["model.layers.1.mlp.down_proj.weight"]
    write_safetensors(path, header, data)  # the bytes no longer tile: refused as a header that lies


def _hidden_mismatch(folder: Path) -> None:
    edit_config(folder, hidden_size=256)


def _index(weight_map: object) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return corrupt


WEIGHT_CASES = [
    ("pickle-as-safetensors", _pickle, "model.safetensors", "not a safetensors file"),
    ("pickle-only", _pickle_only, "model", "pickled weights"),
    ("header-length-lies", _header_length, "model.safetensors", "header claims"),
    ("offsets-beyond-file", _offsets_beyond, "model.safetensors", "bad safetensors header"),
    ("shape-does-not-match-bytes", _shape_lies, "model.safetensors", "model.norm.weight"),
    ("header-not-json", _header_not_json, "model.safetensors", "bad safetensors header"),
    ("truncated", _truncated, "model.safetensors", "truncated"),
    ("missing-tensor", _missing_tensor, "model.safetensors", "bad safetensors header"),
    ("hidden-size-mismatches-weights", _hidden_mismatch, "model.safetensors", "model.embed_tokens.weight"),
    ("index-traversal", _index({"w": "../../../../../../etc/passwd"}), "model.safetensors.index.json", "outside"),
    ("index-absolute", _index({"w": "/etc/passwd"}), "model.safetensors.index.json", "outside"),
    ("index-names-a-pickle", _index({"w": "pytorch_model.bin"}), "model.safetensors.index.json", "pickled"),
    ("index-names-a-missing-shard", _index({"w": "model-00002.safetensors"}), "model.safetensors.index.json",
     "missing shard"),
    ("index-weight-map-a-list", _index(["model.safetensors"]), "model.safetensors.index.json", "weight_map"),
]


@pytest.mark.parametrize("corrupt, file, needle", [c[1:] for c in WEIGHT_CASES], ids=[c[0] for c in WEIGHT_CASES])
def test_hostile_weights_are_one_line_naming_the_file(capsys, tmp_path, watch, monkeypatch, corrupt, file,
                                                      needle) -> None:
    import pickle

    import torch

    def refuse(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a pickle was loaded")

    folder = copy(TARGET, tmp_path / "model")
    corrupt(folder)
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    line = one_line_error(capsys, generate(folder))
    assert str(folder / file if file != "model" else folder) in line and needle in line, line
    assert not [p for p in watch if Path(p).resolve() == Path("/etc/passwd")], watch


@pytest.fixture
def outside(tmp_path) -> Path:
    """A valid checkpoint beside the model folder: what a link or an index must not reach."""
    return copy(TARGET, tmp_path / "outside")


def _not_opened(opened: list[str], folder: Path) -> None:
    reached = [p for p in opened if Path(p).resolve().is_relative_to(folder.resolve())]
    assert not reached, reached


def test_an_index_pointing_outside_is_refused_before_opening(capsys, tmp_path, watch, outside) -> None:
    folder = copy(TARGET, tmp_path / "model")
    _index({"w": "../outside/model.safetensors"})(folder)
    line = one_line_error(capsys, generate(folder))
    assert str(folder / "model.safetensors.index.json") in line and "outside" in line, line
    _not_opened(watch, outside)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_a_link_out_of_the_folder_is_refused_before_opening(capsys, tmp_path, watch, outside, name) -> None:
    folder = copy(TARGET, tmp_path / "model")
    (folder / name).unlink()
    (folder / name).symlink_to(outside / name)
    line = one_line_error(capsys, generate(folder))
    assert str(folder / name) in line and "outside the model folder" in line, line
    _not_opened(watch, outside)


def test_profile_refuses_a_config_link_out_of_the_folder_before_opening(capsys, tmp_path, watch, outside) -> None:
    folder = copy(TARGET, tmp_path / "model")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(outside / "config.json")
    line = one_line_error(capsys, profile(folder))
    assert str(folder / "config.json") in line and "outside the model folder" in line, line
    _not_opened(watch, outside)


def test_serve_and_bench_refuse_a_hostile_folder_in_one_line(capsys, tmp_path) -> None:
    folder = copy(TARGET, tmp_path / "model")
    _header_length(folder)
    cfg = tmp_path / "dspark.yaml"
    cfg.write_text("device: cpu\ndrafter:\n  method: plain\n")
    line = one_line_error(capsys, ["serve", "--config", str(cfg), "--model", str(folder), "--port", "0"])
    assert str(folder / "model.safetensors") in line and "header claims" in line, line
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f"}\n')
    line = one_line_error(capsys, ["bench", "--prompts", str(prompts), "--model", str(folder), "--methods", "plain",
                                   "--repeats", "1", "--max-new-tokens", "2"])
    assert str(folder / "model.safetensors") in line and "header claims" in line, line


# -- drafters, through an engine config's drafter.path -----------------------------------------------------------------
def _drafter_set(**changes: object) -> Callable[[Path], None]:
    return lambda folder: edit_config(folder, **changes)


def _drafter_dflash(**changes: object) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["dflash_config"].update(changes)
        (folder / "config.json").write_text(json.dumps(cfg))
    return corrupt


def _drafter_rank_mismatch(folder: Path) -> None:
    edit_config(folder, markov_rank=65)  # in bounds, but the weights were trained at 64


DRAFTER_CASES = [
    ("absurd-block", _drafter_dflash(block_size=2**20), "config.json", "block_size"),
    ("absurd-rank", _drafter_set(markov_rank=2**31), "config.json", "markov_rank"),
    ("absurd-layers", _drafter_set(num_hidden_layers=10**6), "config.json", "num_hidden_layers"),
    ("zero-heads", _drafter_set(num_attention_heads=0), "config.json", "num_attention_heads"),
    ("negative-mask-token", _drafter_dflash(mask_token_id=-1), "config.json", "mask_token_id"),
    ("target-layer-ids-a-string", _drafter_dflash(target_layer_ids="0,1"), "config.json", "target_layer_ids"),
    ("json-list", lambda f: (f / "config.json").write_text("[]"), "config.json", "object"),
    ("header-length-lies", _header_length, "model.safetensors", "header claims"),
    ("rank-mismatches-weights", _drafter_rank_mismatch, "model.safetensors", "markov_head.markov_w1.weight"),
]


@pytest.mark.parametrize("corrupt, file, needle", [c[1:] for c in DRAFTER_CASES], ids=[c[0] for c in DRAFTER_CASES])
def test_a_hostile_drafter_is_one_line_naming_the_file(capsys, tmp_path, corrupt, file, needle) -> None:
    folder = copy(DRAFTER, tmp_path / "drafter")
    corrupt(folder)
    cfg = tmp_path / "dspark.yaml"
    cfg.write_text(f"device: cpu\ndrafter:\n  method: dspark\n  path: {folder}\nspec:\n  head: markov\n")
    line = one_line_error(capsys, ["generate", "--config", str(cfg), "--prompt", "def f", "--max-new-tokens", "2"])
    assert str(folder / file) in line and needle in line, line


def test_a_drafter_weight_link_out_of_the_folder_is_refused_before_opening(capsys, tmp_path, watch) -> None:
    folder = copy(DRAFTER, tmp_path / "drafter")
    elsewhere = copy(DRAFTER, tmp_path / "elsewhere")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(elsewhere / "model.safetensors")
    cfg = tmp_path / "dspark.yaml"
    cfg.write_text(f"device: cpu\ndrafter:\n  method: dspark\n  path: {folder}\nspec:\n  head: markov\n")
    line = one_line_error(capsys, ["generate", "--config", str(cfg), "--prompt", "def f", "--max-new-tokens", "2"])
    assert str(folder / "model.safetensors") in line and "outside the model folder" in line, line
    _not_opened(watch, elsewhere)


def test_every_published_config_passes_the_bounds() -> None:
    """The bounds refuse hostile values, not real models: every catalogue and test config still reads."""
    from dspark_core.modeling.arch import SUPPORTED, ArchConfig
    from profiler.arch import read_config
    from profiler.catalog import models

    root = Path(__file__).resolve().parents[1]
    configs = [(e.name, e.config) for e in models()]
    configs += [(p.name, json.loads(p.read_text())) for p in sorted((root / "profiler" / "configs").glob("*.json"))]
    for name, cfg in configs:
        read_config(cfg, name)
        if cfg.get("model_type") in SUPPORTED:
            ArchConfig.from_dict(cfg, name)
    assert len(configs) > 30
