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
                   "--json", str(js), "--step-models", ""])
    assert rc == 0
    rows = json.loads(js.read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["verify_sample", "verify_sample", "rmsnorm", "rmsnorm"]
    assert all(r["correct"] for r in rows)
    text = out.read_text()
    assert "| verify sampling |" in text and "DRY RUN" in text and "Prefix-scheduler admission" in text


def test_engine_step_dry_run(monkeypatch) -> None:
    """benchmarks/gpu_step.py's cases run on a CPU (tiny shape; graph ways called uncaptured), limits positive."""
    import torch

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import gpu_step

    saved = []
    cases = gpu_step.run(["tiny"], device="cpu", dry=True, bench=lambda fn: (fn(), 1.0)[1], copy_gbs=1.0, context=16,
                         rows=(1, 2), compile_rows=(), deadline=float("inf"), save=lambda c, h: saved.append(len(c)),
                         header={"gpu": "cpu", "torch": torch.__version__, "dry_run": True})
    assert [(c.rows, c.tokens) for c in cases] == [(1, 1), (1, 9), (2, 1), (2, 9)]
    assert all(set(c.ms) == {"eager", "eager+graph"} and not c.errors and c.limit_ms > 0 for c in cases)
    assert saved == [1, 2, 3, 4]
    text = gpu_step.markdown(cases, {"gpu": "cpu", "torch": "x", "context": 16, "copy_gbs": 1.0, "dry_run": True,
                                     "stream_ms": {}})
    assert "| tiny | 2 x 9 |" in text and "verify 9 / plain 1" in text
