"""The tuner's parameter namespace, read from kb/catalog/params.yaml (data beside the code)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

PARAMS_FILE = Path(__file__).parent / "catalog" / "params.yaml"
EVALUATORS = ("engine", "simulator")  # readers whose output a search sees
EXPORTERS = ("sglang", "vllm")  # readers that only write the launch scripts
READERS = EVALUATORS + EXPORTERS


@dataclass(frozen=True)
class ParamSpec:
    name: str  # dotted parameter name, e.g. "spec.block_size"
    type: str  # int | float | bool | cat
    domain: tuple[Any, ...] | None  # (low, high) for numbers, the choices for cat, None if open
    doc: str  # one line on what it controls
    readers: tuple[str, ...] = ()  # what reads it: engine, simulator, sglang, vllm (none = inert)
    design: bool = False  # a drafter checkpoint's property: modelled to advise a drafter, never exported
    default: Any = None  # its value when neither planned nor in the engine's config (design parameters)
    hot: tuple[str, ...] = ()  # readers that take a new value without a restart (a running server reconfigured)

    @property
    def searchable(self) -> bool:
        """An evaluator reads it, so a search can see what its value does."""
        return any(r in EVALUATORS for r in self.readers)

    def admits(self, value: Any) -> bool:
        """Whether ``value`` has this parameter's type and lies in its domain."""
        if self.type == "bool":
            return isinstance(value, bool)
        if self.type == "cat":
            return isinstance(value, (str, int, float)) and (self.domain is None or value in self.domain)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type == "int" and not float(value).is_integer():
            return False
        return self.domain is None or self.domain[0] <= value <= self.domain[1]


@cache
def _registry() -> tuple[dict[str, ParamSpec], tuple[ParamSpec, ...]]:
    data = yaml.safe_load(PARAMS_FILE.read_text())

    def spec(name: str, d: dict[str, Any]) -> ParamSpec:
        readers = tuple(d.get("readers", ()))
        unknown = set(readers) - set(READERS)
        if unknown:
            raise ValueError(f"{PARAMS_FILE}: {name} names unknown readers {sorted(unknown)}; use {', '.join(READERS)}")
        hot = tuple(d.get("hot", ()))
        if set(hot) - set(readers):
            raise ValueError(f"{PARAMS_FILE}: {name} is hot for {sorted(set(hot) - set(readers))}, which do not read "
                             "it; list them in its readers or drop them from hot")
        return ParamSpec(name, d["type"], tuple(d["domain"]) if "domain" in d else None, d.get("doc", ""), readers,
                         bool(d.get("design", False)), d.get("default"), hot)

    named = {name: spec(name, d) for name, d in data["params"].items()}
    patterns = tuple(spec(p["prefix"], p) for p in data["patterns"])
    return named, patterns


def all_params() -> dict[str, ParamSpec]:
    return dict(_registry()[0])


def param_spec(name: str) -> ParamSpec | None:
    """The spec of ``name``, or of the pattern it matches (``kernel.<name>.<knob>``), else None."""
    named, patterns = _registry()
    if name in named:
        return named[name]
    for p in patterns:
        rest = name[len(p.name):] if name.startswith(p.name) else ""
        if rest and all(part for part in rest.split(".")):
            return ParamSpec(name, p.type, None, p.doc, p.readers, p.design, p.default)
    return None
