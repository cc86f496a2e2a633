"""The data catalogues in profiler/catalog/ (models, GPUs, workloads) and forgiving name lookup."""

from __future__ import annotations

import difflib
import re
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from profiler.errors import ProfileError

CATALOG_DIR = Path(__file__).parent / "catalog"


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params_total: float  # vendor's total parameter count
    params_active: float | None = None  # vendor's activated parameter count (MoE)
    active_excludes_input_embedding: bool = False  # the vendor leaves the input embedding out of `active`
    source: str  # where the figures were published


class ModelEntry(BaseModel):
    """One catalogue row: a published config.json with its source."""

    model_config = ConfigDict(extra="forbid")
    name: str  # canonical name, e.g. "Qwen3-8B"
    family: str  # family key, e.g. "qwen3"
    aliases: list[str] = Field(default_factory=list)  # other spellings users type
    default_for: str | None = None  # a bare family name that resolves to this row
    source: str  # URL of the config.json
    published: Published
    config: dict[str, Any]  # config.json fields, verbatim


def _norm(name: str) -> str:
    """Lower-case, no separators: 'H100-SXM' == 'h100_sxm' == 'h100 sxm'."""
    return re.sub(r"[\s_\-./]+", "", name.strip().lower())


def _load_yaml(name: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
    path = CATALOG_DIR / name
    with path.open() as f:
        return yaml.load(f, Loader=loader)


@cache
def sglang_defaults() -> dict[str, dict[str, dict[str, float]]]:
    """SGLang 0.5.23's resolved memory defaults per catalogue GPU name and TP (catalog/sglang_defaults.yaml, pinned
    by benchmarks/pin_sglang_defaults.py from SGLang's own resolution)."""
    return _load_yaml("sglang_defaults.yaml")["gpus"]


@cache
def models() -> tuple[ModelEntry, ...]:
    return tuple(ModelEntry.model_validate(m) for m in _load_yaml("models.yaml")["models"])


def _closest(query: str, names: list[str], n: int = 5) -> list[str]:
    by_norm = {_norm(x): x for x in names}
    hits = difflib.get_close_matches(_norm(query), list(by_norm), n=n, cutoff=0.4)
    contains = [x for k, x in by_norm.items() if _norm(query) in k or k in _norm(query)]
    out: list[str] = []
    for x in contains + [by_norm[h] for h in hits]:
        if x not in out:
            out.append(x)
    return out[:n]


def resolve_model(query: str) -> tuple[ModelEntry, str | None]:
    """Catalogue row for ``query`` and a note when a bare family name was widened to a size."""
    q = _norm(query)
    for m in models():
        if q == _norm(m.name) or q in {_norm(a) for a in m.aliases}:
            return m, None
    for m in models():
        if m.default_for and q == _norm(m.default_for):
            sizes = ", ".join(x.name for x in models() if x.family == m.family)
            return m, f"'{query}' resolved to {m.name}, the family's flagship dense size (others: {sizes})"
    # a family prefix with an 'instruct'/'base' suffix: Qwen3-8B-Instruct, qwen3-8b-base
    stripped = re.sub(r"(instruct|base|chat|it)$", "", q)
    for m in models():
        if stripped and stripped == _norm(m.name):
            return m, f"'{query}' resolved to {m.name} (same architecture)"
    names = [m.name for m in models()]
    close = _closest(query, names) or names[:8]
    raise ProfileError(f"unknown model '{query}'; closest: {', '.join(close)} "
                       f"(see `profile --list-models`, or pass a config.json / model folder / .onnx path)")


class GpuEntry(BaseModel):
    """One GPU catalogue row: datasheet figures (dense, not sparse) with their source."""

    model_config = ConfigDict(extra="forbid")
    name: str
    aliases: list[str] = Field(default_factory=list)
    vendor: str
    arch: str
    sm: int
    memory_gb: float
    bandwidth_gbs: float | None = None
    peak_tflops: dict[str, float | None] = Field(default_factory=dict)
    fp8: bool
    num_sms: int | None = None
    l2_mb: float | None = None
    interconnect: str
    interconnect_gbs: float | None = None
    source: str


@cache
def gpus() -> tuple[GpuEntry, ...]:
    return tuple(GpuEntry.model_validate(g) for g in _load_yaml("gpus.yaml")["gpus"])


def resolve_gpu(query: str) -> GpuEntry:
    """Forgiving lookup: 'h100', 'H100-SXM', 'h100_sxm', 'NVIDIA H100 80GB HBM3' all find H100-SXM."""
    q = _norm(query)
    for g in gpus():
        if q == _norm(g.name) or q in {_norm(a) for a in g.aliases}:
            return g
    names = [g.name for g in gpus()]
    raise ProfileError(f"unknown GPU '{query}'; known: {', '.join(names)} (or `--gpu auto` to detect this machine)")


@cache
def workload_presets() -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in _load_yaml("workloads.yaml")["workloads"]}


class DrafterEntry(BaseModel):
    """A published DSpark drafter for a catalogue model (profiler/catalog/drafters.yaml)."""

    model_config = ConfigDict(extra="forbid")
    target: str  # the model catalogue's name of its target
    id: str  # Hugging Face model id
    head: str  # none | markov | rnn
    layers: int  # draft transformer layers
    block_size: int  # block it was trained for
    markov_rank: int  # r of its Markov head
    confidence_head: bool  # has a trained confidence head
    target_layers: list[int]  # target layers it reads (HF numbering)
    mask_token_id: int  # the token its mask slots embed
    source: str  # where its architecture is documented


@cache
def drafters() -> tuple[DrafterEntry, ...]:
    return tuple(DrafterEntry.model_validate(d) for d in _load_yaml("drafters.yaml")["drafters"])


def published_drafter(model_name: str | None) -> DrafterEntry | None:
    """The published drafter for a catalogue model, if one is listed."""
    if not model_name:
        return None
    return next((d for d in drafters() if _norm(d.target) == _norm(model_name)), None)
