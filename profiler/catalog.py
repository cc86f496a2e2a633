"""The data catalogues in profiler/catalog/ (models, GPUs, workloads) and forgiving name lookup."""

from __future__ import annotations

import difflib
import re
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from profiler.errors import ProfileError

CATALOG_DIR = Path(__file__).parent / "catalog"


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params_total: float  # vendor's total parameter count
    params_active: float | None = None  # vendor's activated parameter count (MoE)
    active_excludes_input_embedding: bool = False  # the vendor leaves the input embedding out of `active`
    total_excludes_vision: bool = False  # the vendor's total is the language model's (the vision tower left out)
    tolerance: float | None = None  # relative tolerance of the checks (total, active) where the vendor's figure
    # is approximate (one or two significant figures)
    tolerance_why: str | None = None  # why the figure is approximate (required with `tolerance`)
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
    config: dict[str, Any] = Field(default_factory=dict)  # config.json fields, verbatim (inline rows)
    config_file: str | None = None  # a vendored config.json under catalog/ (configs/SOURCES.yaml), read verbatim

    @model_validator(mode="after")
    def _load_config_file(self) -> ModelEntry:
        if self.config_file is None:
            if not self.config:
                raise ValueError(f"{self.name}: give `config` or `config_file`")
            return self
        if self.config:
            raise ValueError(f"{self.name}: give `config` or `config_file`, not both")
        import json

        path = (CATALOG_DIR / self.config_file).resolve()
        if CATALOG_DIR.resolve() not in path.parents or not path.is_file():
            raise ValueError(f"{self.name}: config_file {self.config_file} is not a file under {CATALOG_DIR}")
        self.config = json.loads(path.read_text(encoding="utf-8"))
        return self


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


class AcceptanceEntry(BaseModel):
    """One published acceptance figure of a drafter (profiler/catalog/drafters.yaml)."""

    model_config = ConfigDict(extra="forbid")
    domain: str  # chat | code | math | mixed
    steps: int  # draft tokens per round K of the figure
    tau: float | None = None  # mean accepted tokens per round incl. the bonus token at `steps`
    tau_at_steps: dict[str, float] | None = None  # tau per draft length where the source gives several
    per_position: list[float] | None = None  # conditional acceptance per position, where published
    temperature: float | None = None  # sampling temperature (None: not stated)
    dataset: str  # benchmark(s) the figure is over
    datasets: dict[str, float] | None = None  # tau per benchmark behind a domain mean
    tree: dict[str, int] | None = None  # EAGLE tree settings of the figure (topk, draft_tokens), if not a chain
    reported_by: str  # authors | engine | third_party
    source: str  # title / repo / path / commit or URL
    quote: str  # the words the figure is read from

    @model_validator(mode="after")
    def _known(self) -> AcceptanceEntry:
        if self.domain not in ("chat", "code", "math", "mixed"):
            raise ValueError(f"acceptance domain {self.domain!r} is not chat, code, math or mixed")
        if self.reported_by not in ("authors", "engine", "third_party"):
            raise ValueError(f"reported_by {self.reported_by!r} is not authors, engine or third_party")
        if self.tau is None and not self.per_position:
            raise ValueError("an acceptance entry needs tau or per_position")
        return self


class AcceptanceRef(BaseModel):
    """Acceptance catalogued elsewhere (the DSpark paper's Table 1 in tuner/catalog/acceptance_priors.yaml)."""

    model_config = ConfigDict(extra="forbid")
    file: str  # path from the repository root
    table: str  # top-level key: domain_means (columns math, code, chat, all9)
    model: str  # row
    method: str  # column group (dspark, dflash, eagle3)
    steps: int  # draft tokens per round of the figures
    temperature: float | None = None


class DrafterEntry(BaseModel):
    """A published drafter for a catalogue model, any method (profiler/catalog/drafters.yaml)."""

    model_config = ConfigDict(extra="forbid")
    target: str  # the model catalogue's name of its target
    id: str  # Hugging Face model id (MTP: the target checkpoint that ships the modules)
    method: str  # dspark | dflash | eagle3 | mtp | draft_model
    head: str | None = None  # dspark / dflash: none | markov | rnn
    layers: int | None = None  # draft transformer layers (EAGLE-3 and an MTP module: 1)
    block_size: int | None = None  # dspark / dflash: block it was trained for
    markov_rank: int | None = None  # r of its Markov head (dflash: 0)
    confidence_head: bool | None = None  # has a trained confidence head
    target_layers: list[int] | None = None  # target layers it reads (HF numbering)
    mask_token_id: int | None = None  # the token its mask slots embed
    hidden: int | None = None  # eagle3: width of its layer
    intermediate: int | None = None  # eagle3: MLP width of its layer
    draft_vocab: int | None = None  # eagle3: LM-head vocabulary (draft_vocab_size / d2t)
    draft_model: str | None = None  # draft_model: the catalogue name of the small model
    mtp_modules: int | None = None  # mtp: num_nextn_predict_layers
    trained_steps: int | None = None  # draft tokens it was trained for
    source: str  # where its architecture is documented
    acceptance: list[AcceptanceEntry] = Field(default_factory=list)
    acceptance_ref: AcceptanceRef | None = None

    @model_validator(mode="after")
    def _method_facts(self) -> DrafterEntry:
        if self.method not in DRAFTER_METHODS:
            raise ValueError(f"{self.id}: method {self.method!r} is not one of {', '.join(DRAFTER_METHODS)}")
        if self.method == "dspark" and (self.head is None or self.layers is None or self.block_size is None):
            raise ValueError(f"{self.id}: a dspark drafter needs head, layers and block_size")
        if self.method == "draft_model" and not self.draft_model:
            raise ValueError(f"{self.id}: a draft_model drafter names its catalogue model (draft_model)")
        return self


DRAFTER_METHODS = ("dspark", "dflash", "eagle3", "mtp", "draft_model")  # published checkpoints
HOST_METHODS = ("ngram", "suffix")  # proposals from the text itself: no checkpoint
AUTO_ORDER = ("dspark", "eagle3", "mtp", "dflash", "draft_model")  # `--drafter auto` takes the first published


@cache
def drafters() -> tuple[DrafterEntry, ...]:
    return tuple(DrafterEntry.model_validate(d) for d in _load_yaml("drafters.yaml")["drafters"])


def drafters_for(model_name: str | None) -> list[DrafterEntry]:
    """The model's published drafters in `--drafter auto`'s order (then catalogue order within a method)."""
    if not model_name:
        return []
    mine = [d for d in drafters() if _norm(d.target) == _norm(model_name)]
    return sorted(mine, key=lambda d: AUTO_ORDER.index(d.method))


def published_drafter(model_name: str | None, method: str | None = "dspark") -> DrafterEntry | None:
    """The model's first published drafter of `method` (None: of any method, in AUTO_ORDER)."""
    return next((d for d in drafters_for(model_name) if method is None or d.method == method), None)
