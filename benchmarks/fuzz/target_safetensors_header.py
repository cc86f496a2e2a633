"""Fuzz target `safetensors_header`: the safetensors header reader (dspark_core/modeling/weights.py `read_header`).

One input is written as a `.safetensors` file. `read_header` either refuses it with its one-line DSparkError, or
accepts it; then the safetensors library itself must load the file, with exactly the tensors, dtypes and shapes the
accepted header promised. So a crash is either an exception other than DSparkError from our reader, or a header we
accept that the library refuses or reads differently: the loader would then fail past our checks.

Framing: the first input byte picks how the rest becomes the file. Even: the rest is the file as it is (length
prefix included). Odd: the rest is `header + data`, split after its last `}`, and the file is written with the
8-byte length of that header in front: mutations of the JSON then keep the length consistent instead of breaking it
at once, so the fuzzer reaches the header's fields (a lying length is still reached through the even framing).
"""

from __future__ import annotations

from scratch import write

from dspark_core.errors import DSparkError
from dspark_core.modeling.weights import read_header

MAX_LEN = 4096
TORCH_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
               "I16": "int16", "F16": "float16", "BF16": "bfloat16", "I32": "int32", "F32": "float32",
               "I64": "int64", "F64": "float64"}


def _seeds() -> list[bytes]:
    """Small valid files: several dtypes, an empty tensor, a scalar, metadata, no tensors."""
    import torch
    from safetensors.torch import save

    out = [save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}),
           save({"e": torch.zeros(0, 4, dtype=torch.float16), "s": torch.tensor(7, dtype=torch.int64)},
                metadata={"format": "pt"}),
           save({"m": torch.tensor([True, False]), "q": torch.zeros(4, dtype=torch.int8)}),
           save({})]
    framed = []
    for blob in out:  # the same files in the odd framing: header (its padding dropped) + data, no length prefix
        n = int.from_bytes(blob[:8], "little")
        framed.append(b"\x01" + blob[8 : 8 + n].rstrip(b" ") + blob[8 + n :])
    return [b"\x00" + blob for blob in out] + framed


SEEDS: list[bytes] = _seeds()
DICTIONARY: list[bytes] = [b'"dtype"', b'"shape"', b'"data_offsets"', b'"__metadata__"', b'"F32"', b'"BF16"',
                           b'"F16"', b'"I64"', b'"F8_E4M3"', b'"U64"', b'"F4"', b"[0, 0]", b"[]", b"null",
                           b"18446744073709551615", b"18446744073709551616", b"9223372036854775808",
                           b"\\ud800", b"NaN", b"{}"]


def frame(data: bytes) -> bytes:
    """The file an input stands for (see the module docstring)."""
    if not data or not data[0] & 1:
        return data[1:]
    body = data[1:]
    cut = body.rfind(b"}") + 1
    return len(body[:cut]).to_bytes(8, "little") + body


def fuzz_one(data: bytes) -> None:
    """`read_header` on `data`; an accepted header must load in safetensors exactly as promised."""
    from safetensors.torch import load_file

    path = write("model.safetensors", frame(data))
    try:
        header = read_header(path)
    except DSparkError:
        return
    tensors = load_file(str(path))  # must not raise: our reader accepted the file
    if set(tensors) != set(header.tensors):
        raise AssertionError(f"library read tensors {sorted(tensors)[:5]}, header promised "
                             f"{sorted(header.tensors)[:5]}")
    for name, info in header.tensors.items():
        t = tensors[name]
        if tuple(t.shape) != info.shape or str(t.dtype).removeprefix("torch.") != TORCH_NAMES[info.dtype]:
            raise AssertionError(f"{name}: library read {t.dtype} {list(t.shape)}, header promised {info.dtype} "
                                 f"{list(info.shape)}")
