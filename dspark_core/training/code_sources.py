"""Where a drafter's code prompts come from: the standard library, or the installed third-party packages.

`stdlib` is the original recipe: random windows of the standard library's sources. `site` draws from the pure-Python
packages of the running environment's site-packages, one package at a time (a random package, then a random file of
it, so the few huge packages do not crowd out the rest), and never from `BENCH_PACKAGES`, the packages the held-out
code benchmark (benchmarks/prompts/heldout_code.jsonl) takes its prompts from. Either source can end a share of its
windows at a `def ...:` line, the shape of the benchmark's prompts: the target then writes a function body.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_core.errors import DSparkError

if TYPE_CHECKING:  # torch only where windows are built: the package lists are read without it
    import torch

BENCH_PACKAGES = ("click", "jinja2", "rich", "typer", "alembic", "mako", "markdown_it", "annotated_types", "h11",
                  "filelock", "colorlog", "iniconfig")  # the held-out benchmark's sources: never trained on
SOURCES = ("stdlib", "site")
MAX_FILE_BYTES = 256 * 1024  # larger files are generated tables more often than code; skipped unread
HELDOUT_SHARE = 6  # of 256: a file is held out when the first byte of the hash of its relative path is below this


def _site_heldout(rel: str) -> bool:
    return hashlib.sha1(rel.encode()).digest()[0] < HELDOUT_SHARE


def site_sources(heldout: bool) -> dict[str, list[Path]]:
    """Package -> its sorted `.py` files in site-packages (outside BENCH_PACKAGES and private `_` folders), the
    training split (heldout=False) or the held-out ~2 % (heldout=True, by a hash of the path under site-packages)."""
    site = Path(sysconfig.get_paths()["purelib"])
    out: dict[str, list[Path]] = {}
    if not site.is_dir():
        return out
    for pkg in sorted(p for p in site.iterdir() if p.is_dir() and p.name.isidentifier()):
        if pkg.name in BENCH_PACKAGES or pkg.name.startswith("_"):
            continue
        files = [f for f in sorted(pkg.rglob("*.py"))
                 if _site_heldout(f.relative_to(site).as_posix()) == heldout and f.stat().st_size <= MAX_FILE_BYTES]
        if files:
            out[pkg.name] = files
    return out


def stdlib_groups(heldout: bool) -> dict[str, list[Path]]:
    """The standard library's split as one group (its windows are drawn file by file, as before)."""
    from dspark_core.training.build_tiny import is_heldout, stdlib_sources

    files = [f for f in stdlib_sources() if is_heldout(f) == heldout]
    return {"stdlib": files} if files else {}


def _def_ends(text: str) -> list[int]:
    """Character offsets just past each `def ...:` line (its newline included)."""
    ends, pos = [], 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        s = line.strip()
        if s.startswith(("def ", "async def ")) and s.endswith(":"):
            ends.append(pos)
    return ends


def code_windows(encode: Callable[[str], list[int]], groups: dict[str, list[Path]], *, count: int, length: int,
                 seed: int, def_fraction: float) -> torch.Tensor:
    """`count` windows of `length` tokens -> [count, length]: a random group, a random file, then a random window,
    or (for the first `def_fraction` of the rows) the `length` tokens up to the end of a random `def` line."""
    import torch

    if not groups:
        raise DSparkError("no code sources found to build prompts from; is this a full Python install?")
    rng = random.Random(seed)
    names = sorted(groups)
    n_def = round(def_fraction * count)
    out: list[list[int]] = []
    tries = 0
    while len(out) < count and tries < count * 40:
        tries += 1
        group = groups[names[0]] if len(names) == 1 else groups[rng.choice(names)]  # one group: the old draws
        path = rng.choice(group)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(out) < n_def:
            ends = _def_ends(text)
            if not ends:
                continue
            ids = encode(text[: rng.choice(ends)])
            if len(ids) < length:
                continue
            out.append(ids[-length:])
            continue
        ids = encode(text)
        if len(ids) < length + 1:
            continue
        i = rng.randrange(0, len(ids) - length)
        out.append(ids[i:i + length])
    if len(out) < count:
        raise DSparkError(f"found only {len(out)} prompt windows of {length} tokens in "
                          f"{sum(len(v) for v in groups.values())} files; use a shorter --prompt-len")
    return torch.tensor(out)
