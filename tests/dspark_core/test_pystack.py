"""on_deep_stack: a loop whose calls cross a data-stack chunk boundary maps and unmaps a chunk per call; run
under on_deep_stack, it maps none (counted as the minor page faults of first touching a freshly mapped chunk)."""

from __future__ import annotations

import resource
import sys
import threading

import pytest

from dspark_core.pystack import on_deep_stack

SLOTS = 1_250  # 10 KB of stack slots: two such frames never share one 16 KiB chunk
CALLS = 2_000


def _inner() -> int:
    return 1


def _outer() -> int:
    return sum(_inner() for _ in range(CALLS))


# frames of ~10 KB each (reserved, never written), so _inner's frame never fits in the chunk _outer's fills
_inner.__code__ = _inner.__code__.replace(co_stacksize=SLOTS)
_outer.__code__ = _outer.__code__.replace(co_stacksize=SLOTS)


def _faults(fn) -> int:
    """fn's minor page faults, run on a new thread: its data stack starts empty, so where the caller's stack happens
    to end (a pytest-xdist worker's differs from a plain run's) does not decide whether _outer's calls churn."""
    out: list[int] = []

    def run() -> None:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        assert fn() == CALLS
        out.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out, "the measuring thread failed"
    return out[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RUSAGE_THREAD is Linux-only")
def test_deep_stack_stops_chunk_churn() -> None:
    churn = _faults(_outer)
    if churn < CALLS // 2:
        pytest.skip(f"this interpreter ({sys.version.split()[0]}) does not map a chunk per call ({churn} faults)")
    held = _faults(lambda: on_deep_stack(_outer))
    assert held < CALLS // 20, (churn, held)


def test_deep_stack_passes_arguments_and_results() -> None:
    assert on_deep_stack(divmod, 7, 2) == (3, 1)
    assert on_deep_stack(dict, a=1) == {"a": 1}
    with pytest.raises(ZeroDivisionError):
        on_deep_stack(divmod, 1, 0)
