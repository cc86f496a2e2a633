"""Run a long loop on a CPython data-stack chunk of its own, so the hot calls below it never map or unmap one.

CPython (3.11 and later) keeps each thread's Python frames on "data stack" chunks of 16 KiB, mapped with `mmap`.
A call whose frame does not fit in the current chunk maps a new chunk, and returning from that call unmaps it.
When a call made every step sits on a chunk boundary, every step maps and unmaps. inductor's generated `call`
has a large frame (a local per buffer), so a compiled decode step is often that call. Measured on SmolLM2-135M,
bf16, one request, 2 threads: ~1,750 `munmap`s a second, each a TLB shoot-down that interrupts the OpenMP worker
on the other core; decode ran at 29 tok/s instead of 37-45. Whether a launch hits it depends only on how deep
the stack is when the loop starts (`python cli.py bench` did; the same code under `runpy` did not).

`on_deep_stack(fn, ...)` calls `fn` from a frame that reserves `RESERVE_SLOTS` stack slots. That frame never fits
in a 16 KiB chunk, so it gets a 1 MiB chunk of its own, and the ~0.5 MiB left after it holds every frame the
loop pushes: no chunk is mapped or unmapped while the loop runs. Reserved slots are never written, so only the
pages the frames use are touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

RESERVE_SLOTS = 66_000  # 8-byte slots: 528 KB, just over half of a 1 MiB chunk, leaves ~0.5 MiB for callees


def _call(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    return fn(*args, **kwargs)


# the same function with a frame that reserves RESERVE_SLOTS value-stack slots (the frame size CPython allots
# is computed from co_stacksize; a larger one than the bytecode needs is safe and is never written)
_call.__code__ = _call.__code__.replace(co_stacksize=RESERVE_SLOTS)


def on_deep_stack(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`fn(*args, **kwargs)`, with every frame it pushes inside one data-stack chunk held for its whole run."""
    return _call(fn, *args, **kwargs)
