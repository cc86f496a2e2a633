"""Operator census: count the fusable patterns of one decoder layer in an ONNX graph.

For an architecture, one decoder layer is built in torch at a small width with random weights
(profiler/layer.py), exported to ONNX, and the graph is searched for the patterns fusion rules
match on. A given ONNX file is searched the same way. Counts depend on the structure, not the
width, so they are cached per ArchSpec.signature(): in the user cache (computed on this machine)
and in profiler/catalog/census.yaml (the catalogue's signatures, written by
``python -m profiler.census --write-catalog`` and checked against a fresh export by the tests).

Patterns (counts are per graph):
- rmsnorm: ReduceMean over a square (Pow(x, 2) or Mul(x, x)), or an RMSNormalization node
- swiglu / geglu: Mul(act(gate), up) with act = x*Sigmoid(x) (SiLU) or Gelu/Erf/Tanh form
- gate_up_proj: swiglu/geglu whose gate and up MatMuls read the same input (one fused GEMM)
- rope: rotate_half (Neg -> Concat) applied as x*cos + rotate_half(x)*sin
- qkv_proj: an input read by 2+ projection MatMuls whose outputs are split into heads or normed
  (q/k/v; MLA's q_a + kv_a): one fused GEMM
- residual_add_norm: a residual Add (two computed inputs) feeding an RMSNorm
- softmax: Softmax nodes; attention: Softmax between two MatMuls (a flash-attention candidate)
- moe_routing: TopK over router scores
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from dspark_core.atomic import atomic_write_text
from profiler.arch import ArchSpec
from profiler.errors import ProfileError

CENSUS_VERSION = 1  # bump when the patterns change; invalidates caches
OPS = ("rmsnorm", "swiglu", "geglu", "gate_up_proj", "rope", "qkv_proj", "residual_add_norm", "softmax",
       "attention", "moe_routing")
SHIPPED = Path(__file__).parent / "catalog" / "census.yaml"


def cache_path() -> Path:
    base = os.environ.get("DSPARK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dspark-tune")
    return Path(base) / "census.json"


class _Graph:
    """Producer/consumer maps over an onnx GraphProto."""

    def __init__(self, graph: Any) -> None:
        self.nodes = list(graph.node)
        self.consts = {i.name for i in graph.initializer}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for n in self.nodes:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                self.consumers[i].append(n)
        for n in self.nodes:  # Constant nodes are constants too
            if n.op_type == "Constant":
                self.consts.update(n.output)

    def is_const(self, name: str) -> bool:
        if name in self.consts:
            return True
        p = self.producer.get(name)  # a Cast/Identity of a constant is constant
        return p is not None and p.op_type in ("Cast", "Identity") and all(self.is_const(i) for i in p.input)

    def op(self, name: str) -> str | None:
        p = self.producer.get(name)
        return p.op_type if p is not None else None

    def skip_bias(self, name: str) -> list[Any]:
        """Consumers of ``name``, looking through a bias Add (MatMul + Add is a biased Linear)."""
        out = []
        for c in self.consumers.get(name, []):
            if c.op_type == "Add" and any(self.is_const(i) for i in c.input):
                out.extend(self.consumers.get(c.output[0], []))
            else:
                out.append(c)
        return out

    def matmul_of(self, name: str) -> Any | None:
        """The MatMul producing ``name`` (through a bias Add), if any."""
        p = self.producer.get(name)
        if p is not None and p.op_type == "Add":
            p = next((self.producer[i] for i in p.input if i in self.producer
                      and self.producer[i].op_type in ("MatMul", "Gemm")), None)
        return p if p is not None and p.op_type in ("MatMul", "Gemm") else None


def _is_square(g: _Graph, name: str) -> bool:
    p = g.producer.get(name)
    if p is None:
        return False
    if p.op_type == "Pow":
        return True
    return p.op_type == "Mul" and len(p.input) == 2 and p.input[0] == p.input[1]


def _norm_inputs(g: _Graph) -> list[str]:
    """The tensors each RMSNorm normalises."""
    out = []
    for n in g.nodes:
        if n.op_type in ("RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"):
            out.append(n.input[0])
        elif n.op_type == "ReduceMean" and _is_square(g, n.input[0]):
            out.append(g.producer[n.input[0]].input[0])
    return out


def _activation(g: _Graph, name: str, depth: int = 6) -> tuple[str | None, Any | None]:
    """('silu'|'gelu'|None, gate MatMul): what activation produced ``name`` and from which MatMul.

    SiLU is x * Sigmoid(x); GELU is a Gelu node or the erf/tanh expansion. The walk goes upstream
    through elementwise nodes only and stops at the first MatMul (the gate projection).
    """
    kind: str | None = None
    found: Any | None = None
    frontier, seen = [name], set()
    for _ in range(depth):  # the whole neighbourhood: the Sigmoid / Erf sits beside the gate, not above it
        nxt = []
        for t in frontier:
            if t in seen or g.is_const(t):
                continue
            seen.add(t)
            mm = g.matmul_of(t)
            if mm is not None:
                found = found or mm
                continue
            p = g.producer.get(t)
            if p is None:
                continue
            if p.op_type == "Sigmoid":
                kind = kind or "silu"
            elif p.op_type in ("Gelu", "FastGelu", "Erf", "Tanh"):
                kind = "gelu"
            elif p.op_type not in ("Mul", "Add", "Div", "Pow", "Cast", "Sub"):
                continue
            nxt.extend(i for i in p.input if not g.is_const(i))
        frontier = nxt
    return (kind, found) if found is not None else (None, None)


def count_ops(model: Any) -> dict[str, int]:
    """Pattern counts of an onnx ModelProto (see the module docstring)."""
    g = _Graph(model.graph)
    counts = dict.fromkeys(OPS, 0)
    norm_in = _norm_inputs(g)
    counts["rmsnorm"] = len(norm_in)
    for n in g.nodes:
        if n.op_type != "Mul" or len(n.input) != 2 or any(g.is_const(i) for i in n.input):
            continue
        for act, other in (n.input, tuple(reversed(n.input))):
            up = g.matmul_of(other)
            if up is None:
                continue
            kind, gate = _activation(g, act)
            if kind is None or gate is None or gate is up:
                continue
            counts["swiglu" if kind == "silu" else "geglu"] += 1
            if gate.input[0] == up.input[0]:
                counts["gate_up_proj"] += 1
            break
    for n in g.nodes:
        if n.op_type == "Neg":
            for c in g.consumers.get(n.output[0], []):
                if c.op_type == "Concat" and any(
                        m.op_type == "Mul" and any(a.op_type == "Add" for a in g.consumers.get(m.output[0], []))
                        for m in g.consumers.get(c.output[0], [])):
                    counts["rope"] += 1
        elif n.op_type == "Softmax":
            counts["softmax"] += 1
            if g.op(n.input[0]) in ("MatMul", "Add", "Mul", "Div", "Where") and any(
                    c.op_type == "MatMul" for c in g.consumers.get(n.output[0], [])):
                counts["attention"] += 1
        elif n.op_type == "TopK":
            counts["moe_routing"] += 1
        elif n.op_type == "Add" and not any(g.is_const(i) for i in n.input):
            if n.output[0] in norm_in:
                counts["residual_add_norm"] += 1
    head_ops = {"Reshape", "Split", "Slice", "Pow", "ReduceMean", "RMSNormalization",
                "SimplifiedLayerNormalization"}
    act_ops = {"Sigmoid", "Gelu", "Softmax", "Tanh", "Erf", "TopK"}
    readers: dict[str, int] = defaultdict(int)
    for n in g.nodes:
        if n.op_type in ("MatMul", "Gemm") and not g.is_const(n.input[0]) and g.is_const(n.input[1]):
            cons = g.skip_bias(n.output[0])
            if any(c.op_type in head_ops for c in cons) and not any(c.op_type in act_ops for c in cons):
                readers[n.input[0]] += 1
    counts["qkv_proj"] = sum(1 for v in readers.values() if v >= 2)
    return counts


def census_onnx_file(path: str | os.PathLike[str]) -> dict[str, int]:
    """Counts for a given ONNX file; unreadable files are one ProfileError line."""
    import onnx

    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"ONNX file not found: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others for a corrupt file
        raise ProfileError(f"{p}: not a readable ONNX model ({type(e).__name__}); re-export it") from None
    return count_ops(model)


def export_layer(spec: ArchSpec, path: str | os.PathLike[str]) -> None:
    """Export one small-width decoder layer of ``spec``'s structure to ONNX at ``path``."""
    import warnings

    import torch

    from profiler.layer import build_layer

    layer, inputs = build_layer(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(layer, inputs, str(path), dynamo=False, opset_version=20,
                          input_names=["x", "cos", "sin", "mask"], output_names=["y"])


def compute_census(spec: ArchSpec) -> dict[str, int]:
    """Export one layer to a temporary ONNX file and count its patterns."""
    import onnx

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "layer.onnx"
        export_layer(spec, path)
        return count_ops(onnx.load(str(path)))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if data.get("version") == CENSUS_VERSION else {}
    except (OSError, ValueError):
        return {}


def _shipped() -> dict[str, dict[str, int]]:
    if not SHIPPED.is_file():
        return {}
    import yaml

    data = yaml.load(SHIPPED.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    return data.get("census", {}) if data.get("version") == CENSUS_VERSION else {}


def census(spec: ArchSpec, refresh: bool = False) -> tuple[dict[str, int], str]:
    """Counts for ``spec`` and where they came from ('cache', 'catalog' or 'export')."""
    key = spec.signature()
    cp = cache_path()
    if not refresh:
        cached = _read_json(cp).get("census", {}).get(key)
        if cached is not None:
            return dict(cached), "cache"
        shipped = _shipped().get(key)
        if shipped is not None:
            return dict(shipped), "catalog"
    counts = compute_census(spec)
    data = _read_json(cp) or {"version": CENSUS_VERSION, "census": {}}
    data["census"][key] = counts
    try:
        atomic_write_text(cp, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only cache only costs speed
    return counts, "export"


def write_catalog() -> Path:
    """Recompute the census of every catalogue signature into profiler/catalog/census.yaml."""
    import yaml

    from profiler.arch import read_config
    from profiler.catalog import models

    out: dict[str, dict[str, int]] = {}
    for m in models():
        spec = read_config(m.config, m.name)
        if spec.signature() not in out:
            out[spec.signature()] = compute_census(spec)
    header = ("# Operator census per architecture signature, written by `python -m profiler.census "
              "--write-catalog`;\n# tests/profiler/test_census.py re-exports and checks these. Do not edit by hand.\n")
    atomic_write_text(SHIPPED, header + yaml.safe_dump({"version": CENSUS_VERSION, "census": out}, sort_keys=True))
    return SHIPPED


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-catalog"]:
        print(write_catalog())
    else:
        print("usage: python -m profiler.census --write-catalog", file=sys.stderr)
        sys.exit(2)
