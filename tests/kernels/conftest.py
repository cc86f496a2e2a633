"""Kernel tests run the Triton kernels in Triton's CPU interpreter.

Triton picks the interpreter when it is first imported, so TRITON_INTERPRET must be set before any
`import triton` in this process: here, at collection time, before the test modules import the kernels.
If something imported triton earlier without it, the kernel tests fail with that explanation instead of
a compiler crash.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter_active() -> None:
    import triton.language as tl

    if type(tl.max).__name__ != "InterpretedFunction":
        pytest.fail("triton was imported before tests/kernels/conftest.py set TRITON_INTERPRET=1; import "
                    "dspark_core.kernels lazily elsewhere, or export TRITON_INTERPRET=1 for the test run")
    torch.manual_seed(0)
