"""A bounded reader of a GGUF file's header (metadata and tensor infos), for the llama converter (gguf_convert.py).

Why our own and not gguf-py's GGUFReader: GGUFReader walks whatever counts the file claims. An array claiming 2**63
elements past the end of the file loops on empty slices (and grows a list) without end, a string length past the end
reads as empty, a bad tensor type or row size raises from deep inside numpy. Here every count and length is checked
against the bytes left in the file and against fixed limits before it is used, every value has the type the GGUF
spec gives it, and any violation is one DSparkError line naming the file and the offset. Only the header is read
(buffered, front to back); tensor data is mapped by the converter once its byte range is known to lie in the file.

Format (GGUF v2 / v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata count; each metadata
entry a string key, a u32 value type and the value (strings are u64 length + UTF-8 bytes; arrays a u32 element type,
a u64 count and the elements); each tensor info a string name, u32 dimension count, u64 dimensions (fastest first),
u32 ggml type, u64 offset from the aligned start of the data section (`general.alignment`, default 32).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from dspark_core.errors import DSparkError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 16  # llama-405B has ~1,100 tensors
MAX_METADATA = 1 << 16
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 26  # a chat template is tens of kB
MAX_ARRAY = 1 << 24  # vocabularies and merges are up to ~10**6 entries
MAX_NAME_BYTES = 255
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 48
STRING, ARRAY, BOOL = 8, 9, 7
SCALARS: dict[int, tuple[str, str]] = {  # value type -> (struct format, name)
    0: ("<B", "uint8"), 1: ("<b", "int8"), 2: ("<H", "uint16"), 3: ("<h", "int16"), 4: ("<I", "uint32"),
    5: ("<i", "int32"), 6: ("<f", "float32"), 7: ("<B", "bool"), 10: ("<Q", "uint64"), 11: ("<q", "int64"),
    12: ("<d", "float64"),
}
INT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
FLOAT_TYPES = frozenset({6, 12})
TYPE_NAMES = {**{k: v[1] for k, v in SCALARS.items()}, STRING: "string", ARRAY: "array"}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor info: name, ggml type, dimensions (GGUF order, fastest first), byte range from the data start."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions in numpy / torch order (slowest first): [rows, columns] of a weight matrix."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF header read and checked: metadata (key -> value, key -> value type), tensors, where data starts."""

    path: Path
    version: int
    metadata: dict[str, Any]
    types: dict[str, int]  # key -> GGUF value type (ARRAY: also `elem_types[key]`)
    elem_types: dict[str, int]
    tensors: list[GGUFTensor]
    data_offset: int
    file_size: int


def ggml_sizes() -> dict[int, tuple[int, int]]:
    """ggml type -> (block size, bytes per block) for every type gguf-py can dequantize."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import _type_traits

    kinds = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    return {int(k): GGML_QUANT_SIZES[k] for k in kinds}


class _Cursor:
    """Reads little-endian fields front to back, never past the end of the file."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path, self.pos = f, size, path, 0

    def fail(self, what: str) -> DSparkError:
        return DSparkError(f"{self.path}: not a GGUF file the converter reads: {what} (byte {self.pos}); download "
                           "the file again or convert another one")

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes but the file ends {self.size - self.pos} bytes later")
        blob = self.f.read(n)
        if len(blob) != n:
            raise self.fail(f"{what}: the file is shorter than it was")
        self.pos += n
        return blob

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        n = self.scalar("<Q", f"{what} length")
        if n > limit:
            raise self.fail(f"{what} is {n} bytes long (limit {limit})")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, vtype: int, what: str) -> Any:
        if vtype == STRING:
            return self.string(what)
        if vtype not in SCALARS:
            raise self.fail(f"{what} has value type {vtype}, not one of the GGUF scalar types")
        v = self.scalar(SCALARS[vtype][0], what)
        if vtype == BOOL:
            if v > 1:
                raise self.fail(f"{what} is a bool stored as {v}")
            return bool(v)
        return v

    def array(self, what: str) -> tuple[int, list[Any]]:
        etype = self.scalar("<I", f"{what} element type")
        count = self.scalar("<Q", f"{what} element count")
        if etype == ARRAY:
            raise self.fail(f"{what} is an array of arrays, which no llama metadata uses")
        if etype not in SCALARS and etype != STRING:
            raise self.fail(f"{what} has element type {etype}, not a GGUF type")
        least = 8 if etype == STRING else struct.calcsize(SCALARS[etype][0])
        if count > MAX_ARRAY or count * least > self.size - self.pos:
            raise self.fail(f"{what} claims {count} elements, more than the file (or the limit {MAX_ARRAY}) holds")
        if etype == STRING:
            return etype, [self.string(f"{what}[{i}]") for i in range(count)]
        fmt = SCALARS[etype][0]
        items = list(struct.unpack(f"<{count}{fmt[1]}", self.take(count * struct.calcsize(fmt), what)))
        if etype == BOOL:
            if any(x > 1 for x in items):
                raise self.fail(f"{what} holds a bool that is neither 0 nor 1")
            items = [bool(x) for x in items]
        return etype, items


def _tensor(c: _Cursor, sizes: dict[int, tuple[int, int]], i: int) -> GGUFTensor:
    name = c.string(f"tensor {i} name", MAX_NAME_BYTES)
    n_dims = c.scalar("<I", f"tensor {name} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = tuple(c.scalar("<Q", f"tensor {name} dimension") for _ in range(n_dims))
    count = 1
    for d in dims:
        count *= d
        if d < 1 or count > MAX_ELEMENTS:
            raise c.fail(f"tensor {name} has dimensions {list(dims)} (each >= 1, at most {MAX_ELEMENTS} elements)")
    ggml_type = c.scalar("<I", f"tensor {name} type")
    if ggml_type not in sizes:
        raise c.fail(f"tensor {name} has ggml type {ggml_type}, which the converter cannot dequantize")
    block, type_size = sizes[ggml_type]
    if dims[0] % block:
        raise c.fail(f"tensor {name}: row of {dims[0]} is not a multiple of its type's block of {block}")
    offset = c.scalar("<Q", f"tensor {name} offset")
    return GGUFTensor(name, ggml_type, dims, offset, count // block * type_size)


def read_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """The checked header of GGUF file `path`; one DSparkError line (file, byte offset, what) otherwise."""
    p = Path(path)
    sizes = ggml_sizes()
    try:
        with open(p, "rb") as f:
            c = _Cursor(f, os.fstat(f.fileno()).st_size, p)
            if c.size < 4 or c.take(4, "magic") != MAGIC:
                raise c.fail("it does not start with GGUF")
            version = c.scalar("<I", "version")
            if version & 0xFFFF == 0 and version:
                raise c.fail("it is a big-endian GGUF; convert a little-endian one")
            if version not in VERSIONS:
                raise c.fail(f"version {version} (the converter reads {', '.join(map(str, VERSIONS))})")
            n_tensors, n_meta = c.scalar("<Q", "tensor count"), c.scalar("<Q", "metadata count")
            if n_tensors > MAX_TENSORS or n_meta > MAX_METADATA:
                raise c.fail(f"{n_tensors} tensors / {n_meta} metadata entries (limits {MAX_TENSORS} / {MAX_METADATA})")
            meta: dict[str, Any] = {}
            types: dict[str, int] = {}
            elem_types: dict[str, int] = {}
            for i in range(n_meta):
                key = c.string(f"metadata key {i}", MAX_KEY_BYTES)
                if key in meta:
                    raise c.fail(f"metadata key {key!r} appears twice")
                vtype = c.scalar("<I", f"metadata {key} type")
                types[key] = vtype
                if vtype == ARRAY:
                    elem_types[key], meta[key] = c.array(f"metadata {key}")
                else:
                    meta[key] = c.value(vtype, f"metadata {key}")
            tensors = [_tensor(c, sizes, i) for i in range(n_tensors)]
            end_of_infos = c.pos
            size = c.size
    except OSError as e:
        raise DSparkError(f"{p}: cannot read it ({e.strerror}); check the file and its permissions") from None
    return _checked(p, version, meta, types, elem_types, tensors, end_of_infos, size)


def _checked(p: Path, version: int, meta: dict[str, Any], types: dict[str, int], elem_types: dict[str, int],
             tensors: list[GGUFTensor], end_of_infos: int, size: int) -> GGUFHeader:
    """The header once alignment, unique names and every tensor's byte range are checked."""
    def fail(what: str) -> DSparkError:
        return DSparkError(f"{p}: not a GGUF file the converter reads: {what}; download the file again or convert "
                           "another one")

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in meta:
        alignment = meta["general.alignment"]
        if types["general.alignment"] != 4 or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 16:
            raise fail(f"general.alignment {alignment!r} is not a uint32 power of two up to 65536")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise fail(f"tensor {next(n for n in names if names.count(n) > 1)} appears twice")
    data_offset = -(-end_of_infos // alignment) * alignment
    for t in tensors:
        if t.offset % alignment:
            raise fail(f"tensor {t.name} starts at {t.offset}, not a multiple of the alignment {alignment}")
        if data_offset + t.offset + t.n_bytes > size:
            raise fail(f"tensor {t.name} needs bytes {data_offset + t.offset} to {data_offset + t.offset + t.n_bytes} "
                       f"but the file has {size}")
    return GGUFHeader(p, version, meta, types, elem_types, tensors, data_offset, size)
