"""The interpreter a live SGLang study runs on a machine without a GPU: `--engine-python` of `tune --engine sglang`.

`standin_python(folder)` installs SGLang 0.5.23's parser (the `sglang` wheel without its dependencies, plus the
few light packages `sglang.srt.server_args` imports, pinned as benchmarks/interop/requirements-light.txt pins
them) into a cache folder once, and writes `folder/bin/python`: it runs `python -m sglang.launch_server ARGS` as
tests/live/sglang_standin.py (SGLang's parser, then our engine under SGLang's metric names) and anything else
(the tuner's version probe) as this interpreter with that SGLang on its path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SGLANG = "sglang==0.5.23"
LIGHT = ("orjson", "pybase64", "msgspec", "pyzmq", "ipython", "traitlets", "aiohttp", "multidict", "yarl",
         "propcache", "attrs", "aiosignal", "frozenlist", "aiohappyeyeballs")  # what server_args imports


def _pins() -> list[str]:
    pins = {}
    for line in (ROOT / "benchmarks" / "interop" / "requirements-light.txt").read_text().splitlines():
        name, _, version = line.strip().partition("==")
        pins[name.lower()] = version
    return [f"{p}=={pins[p]}" if p in pins else p for p in LIGHT]


def parser_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dspark-tune" / "sglang-parser"


def ensure_parser() -> Path:
    """The folder holding SGLang's parser and its light imports, installed on first use (~15 s, 230 MB)."""
    folder = parser_dir()
    want = " ".join([SGLANG, *_pins()])
    stamp = folder / ".stamp"
    if stamp.is_file() and stamp.read_text() == want:
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp), SGLANG,
                    *_pins()], check=True, capture_output=True, timeout=900)
    (tmp / ".stamp").write_text(want)
    if folder.exists():  # an older install of ours (it has the stamp); anything else there is not ours to remove
        if not stamp.is_file():
            raise OSError(f"{folder} exists and was not installed by tests/live/sglang_python.py; remove it")
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def standin_python(folder: Path) -> Path:
    """`folder`/bin/python: SGLang's launch as the stand-in, anything else with SGLang's parser importable."""
    pkgs = ensure_parser()
    py = folder / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    real, root, pk = shlex.quote(sys.executable), shlex.quote(str(ROOT)), shlex.quote(str(pkgs))
    py.write_text(f"""#!/bin/sh
# a stand-in for SGLang's interpreter (tests/live/sglang_python.py)
if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then
  shift 2
  PYTHONPATH={root} DSPARK_SGLANG_PKGS={pk} exec {real} -m tests.live.sglang_standin "$@"
fi
PYTHONPATH={pk} exec {real} "$@"
""")
    py.chmod(0o755)
    return py
