"""Engine config: YAML round trip, dotted parameters, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dspark_core.config import EngineConfig, apply_params, load_config, save_config
from dspark_core.errors import DSparkError


def test_roundtrip_and_sections_mirror_the_parameter_names(tmp_path: Path) -> None:
    cfg = apply_params(EngineConfig(), {"spec.block_size": 9, "batch.max_requests": 16, "kv.dtype": "fp8_e4m3",
                                        "weights.dtype": "bf16", "attention.backend": "triton", "parallel.tp": 2,
                                        "memory.fraction_static": 0.9, "kernel.rmsnorm.BLOCK": 128})
    path = save_config(cfg, tmp_path / "out" / "dspark.yaml")
    again = load_config(path)
    assert again == cfg
    assert again.spec.block_size == 9 and again.kernel == {"rmsnorm": {"BLOCK": 128}}
    data = yaml.safe_load(path.read_text())
    assert data["batch"]["max_requests"] == 16 and "fusion" not in data


def test_catalog_parameters_the_engine_reads_are_config_fields() -> None:
    """Every parameter of kb/catalog/params.yaml (read as data) that the engine reads is a field of its config, and
    no drafter-design parameter or fusion switch is (a checkpoint's property is never an engine flag)."""
    catalog = Path(__file__).parents[2] / "kb" / "catalog" / "params.yaml"
    names = yaml.safe_load(catalog.read_text())["params"]
    dumped = EngineConfig().model_dump()
    for name, spec in names.items():
        section, field = name.split(".", 1)
        if "engine" in spec["readers"]:
            assert field in dumped.get(section, {}), name
        if spec.get("design") or section == "fusion":
            assert field not in dumped.get(section, {}), name


@pytest.mark.parametrize(
    ("text", "match"),
    [("spec: [1, 2\n", "not valid YAML"), ("- 1\n", "mapping"), ("spec:\n  block_size: 99\n", "spec.block_size"),
     ("spec:\n  nope: 1\n", "spec.nope")],
)
def test_bad_files_give_one_line_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "dspark.yaml"
    p.write_text(text)
    with pytest.raises(DSparkError, match=match) as e:
        load_config(p)
    assert "\n" not in str(e.value)


def test_missing_file_and_unknown_parameter() -> None:
    with pytest.raises(DSparkError, match="not found"):
        load_config("/nonexistent/dspark.yaml")
    with pytest.raises(DSparkError, match="unknown engine parameter"):
        apply_params(EngineConfig(), {"spec.gamma": 3})


def test_a_model_id_loads_from_the_local_cache_only(tmp_path, monkeypatch):
    import shutil

    from dspark_core.config import ASSETS
    from dspark_core.errors import DSparkError
    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(DSparkError, match="huggingface-cli download acme/tiny"):
        checkpoint_folder("acme/tiny")
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)  # the cache's own layout
    shutil.copytree(ASSETS / "target", snap)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    assert checkpoint_folder("acme/tiny") == snap
    assert load_model("acme/tiny", "cpu").arch.vocab_size == 4096


def test_atomic_writes_make_ordinary_files(tmp_path):
    import os
    import stat

    from dspark_core.atomic import atomic_write_text

    umask = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "f.yaml", "a: 1\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600: a bundle is shared


def test_save_model_replaces_only_a_checkpoint_it_wrote(tmp_path: Path) -> None:
    from dspark_core.modeling.checkpoint import check_replaceable

    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "config.json").write_text("{}")
    check_replaceable(ours)  # a checkpoint's own files: replaceable
    check_replaceable(tmp_path / "absent")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(DSparkError, match="did not write"):
        check_replaceable(theirs)
