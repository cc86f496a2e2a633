"""benchmarks/gpu_kernels.py stays runnable: its --dry-run (tiny shapes, interpreter) checks correctness
and writes its table; the timings themselves are only meaningful on a GPU and gate nothing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_kernels.py"


def test_dry_run_writes_the_table(tmp_path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("gpu_kernels", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_kernels", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    out, js = tmp_path / "r.md", tmp_path / "r.json"
    rc = mod.main(["--dry-run", "--sweep", "1", "--kernels", "verify_sample,rmsnorm", "--out", str(out),
                   "--json", str(js)])
    assert rc == 0
    rows = json.loads(js.read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["verify_sample", "verify_sample", "rmsnorm", "rmsnorm"]
    assert all(r["correct"] for r in rows)
    text = out.read_text()
    assert "| verify sampling |" in text and "DRY RUN" in text and "Prefix-scheduler admission" in text
