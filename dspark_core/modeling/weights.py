"""Weight files of a checkpoint folder, checked before a byte of tensor data is read.

* Every file the loader opens (named by `model.safetensors.index.json`, found by glob, or a link) must resolve inside
  the folder: an index naming `../../etc/passwd` or a `model.safetensors` linking out of the folder is refused before
  it is opened. One exception: a Hugging Face cache snapshot (`models--X/snapshots/REV/`) links its files to
  `models--X/blobs/`, which is allowed.
* Pickled weights (`*.bin`, `*.pt`, ...) are never loaded: unpickling can run code. The index may name only
  `.safetensors` files.
* A safetensors header is parsed here, in Python, with the checks the safetensors library makes and some stricter
  ones (a known dtype, no duplicate keys, no NaN literals, no unknown fields, offsets that tile the data exactly),
  so that a header this module accepts loads (checked by the `safetensors_header` fuzz target), and one that lies
  (a length past the file, offsets beyond it, a shape that does not match its bytes) is one line naming the file.
* `check_shapes` compares the headers with the shapes the config implies, so a config whose hidden size does not
  match the weights is refused naming the tensor and file, before the model is allocated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    import torch

INDEX_FILE = "model.safetensors.index.json"
INDEX_MAX_BYTES = 64 * 2**20  # a 1,000-shard index is ~100 kB
HEADER_MAX_BYTES = 100_000_000  # the safetensors library's own limit
MAX_RANK = 8  # dimensions per tensor (checkpoints use 1 to 4)
MAX_ELEMENTS = 2**48  # elements per tensor (also keeps every product inside the library's 64-bit arithmetic)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "I16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "F32": 32, "I64": 64, "F64": 64}  # what torch loads; other safetensors dtypes are refused
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
FIX = "re-export the checkpoint with safetensors (save_file) or download the file again"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors header: dtype, shape and its byte range in the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A validated safetensors header: the file, its tensors and the size of its data section."""

    path: Path
    tensors: dict[str, TensorInfo]
    data_bytes: int


def allowed_roots(folder: Path) -> list[Path]:
    """Where files of `folder` may resolve: the folder, and a Hugging Face cache snapshot's `blobs/`."""
    root = folder.resolve()
    roots = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        roots.append(root.parent.parent / "blobs")
    return roots


def inside(folder: Path, path: Path, named_by: str | None = None) -> Path:
    """`path` when it resolves inside `folder` (allowed_roots), else one DSparkError line; nothing is opened."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop; a name the file system cannot encode
        raise DSparkError(f"{path}: cannot resolve it ({e}); replace the link with the file") from None
    if not any(real == r or real.is_relative_to(r) for r in allowed_roots(folder)):
        by = f" (named by {named_by})" if named_by else ""
        raise DSparkError(f"{path}{by} resolves to {real}, outside the model folder {folder}; checkpoint files must "
                          "sit inside their folder: copy the file in instead of linking or pointing outside")
    return path


def _index_names(index: Path) -> list[str]:
    """The file names `weight_map` lists, parsed and typed; one line naming the index otherwise."""
    try:
        if index.stat().st_size > INDEX_MAX_BYTES:
            raise DSparkError(f"{index}: larger than {INDEX_MAX_BYTES} bytes, not a weight index; {FIX}")
        data = json.loads(index.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or a number past Python's int-digit limit
        raise DSparkError(f"{index} is not valid JSON; fix it or delete it (the *.safetensors files are then "
                          "loaded by name)") from None
    except OSError as e:
        raise DSparkError(f"{index}: cannot read it ({e.strerror}); check its permissions") from None
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
        raise DSparkError(f"{index}: weight_map must be an object of tensor name -> file name; fix it or delete it")
    return sorted(set(wmap.values()))


def _safe_name(folder: Path, name: str, index: Path) -> Path:
    """The file `name` of an index: relative, without `..`, a .safetensors file, resolving inside `folder`."""
    pure = PurePosixPath(name)
    if not _utf8(name):  # a lone surrogate escape: no file system can hold the name, and it cannot be printed
        raise DSparkError(f"{index}: weight_map names {name!r}, which is not a valid file name; fix the index")
    if not name or pure.is_absolute() or ".." in pure.parts or "\\" in name or "\0" in name:
        raise DSparkError(f"{index}: weight_map names {name!r}, a path outside the model folder; an index names "
                          "files inside its folder (model-00001-of-00002.safetensors)")
    if pure.suffix != ".safetensors":
        raise DSparkError(f"{index}: weight_map names {name!r}, not a .safetensors file; the engine never loads "
                          "pickled weights (unpickling can run code): convert them to safetensors")
    path = inside(folder, folder / name, str(index))
    if not path.is_file():
        raise DSparkError(f"{index}: weight_map names {name!r}, which is not in {folder}; download the missing "
                          "shard")
    return path


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (its index's, else every *.safetensors), each inside it."""
    index = folder / INDEX_FILE
    names: list[str] = []
    if index.is_file() or index.is_symlink():
        inside(folder, index)
        names = _index_names(index)
    if names:
        return [_safe_name(folder, n, index) for n in names]
    files = sorted(p for p in folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
        if pickles:
            raise DSparkError(f"{folder} holds pickled weights ({pickles[0]}) and no *.safetensors; the engine never "
                              "unpickles weights (it can run code): convert them to safetensors")
        raise DSparkError(f"no *.safetensors in {folder}; export the checkpoint in safetensors format")
    return [inside(folder, p) for p in files]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape (\ud800), which the library refuses
        return False
    return True


def _tensor(name: str, info: Any) -> TensorInfo:
    """One header entry checked: exactly dtype, shape, data_offsets; sizes consistent. ValueError naming it."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"tensor {name!r}: an entry has exactly dtype, shape and data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ValueError(f"tensor {name!r}: dtype {str(dtype)[:20]!r} is not one of {', '.join(DTYPE_BITS)}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r}: shape must be a list of at most {MAX_RANK} non-negative integers")
    count = 1
    for d in shape:
        count *= d
        if d > MAX_ELEMENTS or count > MAX_ELEMENTS:  # each dimension too: [0, 2**63] has no elements but
            # overflows torch's int64 sizes, and one past 2**64 is not a usize for the library
            raise ValueError(f"tensor {name!r}: shape {shape} has more than {MAX_ELEMENTS} elements")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(x) and x >= 0 for x in offsets):
        raise ValueError(f"tensor {name!r}: data_offsets must be two non-negative integers")
    begin, end = offsets
    if end < begin or end - begin != count * DTYPE_BITS[dtype] // 8:
        raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}] do not hold {dtype} {shape} "
                         f"({count * DTYPE_BITS[dtype] // 8} bytes)")
    return TensorInfo(dtype, tuple(shape), begin, end)


def parse_header(blob: bytes, file_size: int) -> tuple[dict[str, TensorInfo], int]:
    """The tensors of a safetensors header (`blob`: the header's bytes) of a file of `file_size` bytes, and its data
    section's size. ValueError with what is wrong (no file name: `read_header` adds it)."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the header is not UTF-8") from None
    if not text.startswith("{"):
        raise ValueError("the header is not a JSON object")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("the header nests too deeply") from None
    except ValueError as e:
        raise ValueError(f"the header is not valid JSON ({str(e)[:80]})") from None
    if not isinstance(data, dict):
        raise ValueError("the header is not a JSON object")
    meta = data.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or not all(
            isinstance(v, str) and _utf8(v) and _utf8(k) for k, v in meta.items())):
        raise ValueError("__metadata__ must be an object of strings")
    tensors: dict[str, TensorInfo] = {}
    for name, info in data.items():
        if not _utf8(name):
            raise ValueError("a tensor name is not valid UTF-8")
        tensors[name] = _tensor(name, info)
    at = 0
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin != at:
            raise ValueError(f"tensor {name!r} starts at byte {t.begin} of the data, not at {at} (tensors must tile "
                             "the data section)")
        at = t.end
    header_len = len(blob)
    if at != file_size - 8 - header_len:
        raise ValueError(f"the tensors cover {at} bytes but the file holds {file_size - 8 - header_len} bytes of data "
                         "(truncated, or the header's offsets lie)")
    return tensors, at


def read_header(path: Path) -> Header:
    """The validated header of safetensors file `path`; one DSparkError line naming the file otherwise. Reads the
    8-byte length and the header only (at most HEADER_MAX_BYTES)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise DSparkError(f"{path}: {size} bytes, too short to be a safetensors file; {FIX}")
            n = int.from_bytes(head, "little")
            if n > HEADER_MAX_BYTES or n > size - 8:
                raise DSparkError(f"{path}: its header claims {n} bytes but the file holds {size - 8} after the length "
                                  f"(a safetensors header is at most {HEADER_MAX_BYTES}): not a safetensors file or "
                                  f"truncated (a pickle is never loaded); {FIX}")
            blob = f.read(n)
    except OSError as e:
        raise DSparkError(f"{path}: cannot read it ({e.strerror}); check the file and its permissions") from None
    try:
        tensors, data_bytes = parse_header(blob, size)
    except ValueError as e:
        raise DSparkError(f"{path}: bad safetensors header: {e}; {FIX}") from None
    return Header(path, tensors, data_bytes)


def check_shapes(headers: list[Header], expected: dict[str, tuple[int, ...]], folder: Path, what: str,
                 strip: str = "") -> None:
    """Every expected tensor present with the shape the config implies; one line naming tensor and file otherwise.
    `what`: the kind of checkpoint, for the hint (a qwen3 decoder, a DSpark drafter); `strip`: a prefix some writers
    put before the names (`model.` on a drafter's)."""
    found: dict[str, tuple[TensorInfo, Path]] = {}
    for h in headers:
        found.update({n.removeprefix(strip) if strip else n: (t, h.path) for n, t in h.tensors.items()})
    where = headers[0].path if len(headers) == 1 else folder
    for name, shape in expected.items():
        if name not in found:
            raise DSparkError(f"the weights in {where} lack tensor {name}; is it {what}? re-export it")
        info, path = found[name]
        if info.shape != shape:
            raise DSparkError(f"tensor {name} in {path} has shape {list(info.shape)} but its config.json implies "
                              f"{list(shape)}; the config does not describe these weights: fix config.json or "
                              "re-export the checkpoint")


def load_tensors(header: Header) -> dict[str, torch.Tensor]:
    """The tensors of a file whose header was validated; a safetensors or I/O failure is one line naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(header.path))
    except (SafetensorError, OSError, RuntimeError, ValueError, TypeError) as e:
        raise DSparkError(f"{header.path}: safetensors cannot load it ({str(e).splitlines()[0][:120]}); "
                          f"{FIX}") from None
