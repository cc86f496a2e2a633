"""The kernels also build for a real GPU (sm_90 PTX + cubin with Triton's bundled ptxas), not only in the
interpreter, which accepts code the compiler rejects. Runs aot_compile.py in a clean subprocess (this
process has TRITON_INTERPRET=1) with a private Triton cache, so the compile really happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("aot_compile.py")


def test_every_kernel_compiles_for_sm90(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--arch", "90", "--quick"], env=env, capture_output=True,
                          text=True, timeout=600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failures = [r for r in rows if not r["ok"]]
    assert proc.returncode == 0 and not failures, failures or proc.stderr[-2000:]
    labels = {r["kernel"].split("/")[0] for r in rows}
    assert labels == {"verify_greedy", "verify_sample", "rmsnorm", "swiglu", "markov_head"}
    assert len(rows) == 14  # greedy fp32/bf16, sample, 4 split, 2 rmsnorm, swiglu, 3 head + reduce
