"""The profile field vocabulary rule conditions may use, read off the Profile pydantic model."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Union

from pydantic import BaseModel

from profiler.schema import Profile


@dataclass(frozen=True)
class FieldInfo:
    path: str  # dotted path, e.g. "hw.arch"
    kind: str  # "number" | "bool" | "str" | "list" | "dict"
    choices: tuple[Any, ...] | None = None  # the Literal domain, when the field has one


def _unwrap(tp: Any) -> Any:
    """Strip Optional[...] / X | None."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _kind(tp: Any) -> tuple[str, tuple[Any, ...] | None]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "str", typing.get_args(tp)
    if tp is bool:
        return "bool", None
    if tp in (int, float):
        return "number", None
    if origin is list:
        return "list", None
    if origin is dict:
        return "dict", None
    return "str", None


@cache
def profile_fields() -> dict[str, FieldInfo]:
    """Every leaf path of the Profile model; dict-typed fields admit any sub-key (``model.ops.*``)."""
    out: dict[str, FieldInfo] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            tp = _unwrap(f.annotation)
            path = f"{prefix}{name}"
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                walk(tp, path + ".")
                continue
            kind, choices = _kind(tp)
            out[path] = FieldInfo(path, kind, choices)

    walk(Profile, "")
    return out


def lookup_field(path: str) -> FieldInfo | None:
    """The field at ``path``; a sub-key of a dict field (``model.ops.rope``) is a number."""
    fields = profile_fields()
    if path in fields:
        return fields[path]
    head, _, tail = path.rpartition(".")
    if head in fields and fields[head].kind == "dict" and tail:
        return FieldInfo(path, "number")
    return None


def flatten(profile: Profile | dict[str, Any]) -> dict[str, Any]:
    """Dotted path -> value for every non-null leaf (dict fields are flattened one level)."""
    data = profile.model_dump(mode="json", exclude_none=True) if isinstance(profile, Profile) else profile
    flat: dict[str, Any] = {}

    def walk(obj: Any, prefix: str) -> None:
        for k, v in obj.items():
            path = f"{prefix}{k}"
            if isinstance(v, dict):
                flat[path] = v
                walk(v, path + ".")
            else:
                flat[path] = v

    walk(data, "")
    return flat
