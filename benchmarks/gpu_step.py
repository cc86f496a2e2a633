#!/usr/bin/env python
"""The engine's end-to-end decode / verify step on a GPU against the HBM limit (issue 41, "know the limit").

For real decoder shapes (benchmarks/gpu_step_models.json: Qwen3-8B, Llama-3.1-8B, SmolLM2-135M; random bf16
weights, since a step's time depends on shapes only), at rows x tokens = {1, 8, 64} x {1 (plain decode), 9
(verify a block of 8)} over a `--context` of cached keys, four ways of running the same lean model:

* `eager`: `LeanModel.forward`, the engine's eager path (Python launches every kernel; the fused Triton SwiGLU);
* `eager+graph`: the same step's tensor program (dspark_core/modeling/compiled.py `_core`) captured once in a
  CUDA graph and replayed, as SGLang / vLLM run decode: what removing the launch overhead alone buys;
* `compiled`: the engine's `CompiledStep` as `serve --compile` runs it: torch.compile (inductor's Triton code, the
  key span dynamic), and on a GPU each shape replayed from its CUDA graph (key span padded to a power of two),
  plus the host work of building the step's inputs;
* `compiled+graph`: the compiled tensor program alone captured in a CUDA graph at the exact span (no host work).

Each time is a multiple of the limit: the bytes a step must read (every projection's and the LM head's weights
once, plus the rows' cached keys and values) over the measured device-to-device copy bandwidth (read + write
counted, as benchmarks/gpu_kernels.py measures it). `stream` is the time to run every projection once at one row
(F.linear, the kernels' own read). Results are saved after every case, so a run cut short keeps its rows.

    python benchmarks/gpu_step.py [--models qwen3-8b,smollm2-135m] [--budget-s 420] [--out F.md] [--json F.json]
    python benchmarks/gpu_step.py --dry-run      # CPU smoke test: the tiny shape, graphs not captured
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from step_limit import linears  # noqa: E402

from dspark_core.modeling.arch import ArchConfig  # noqa: E402
from dspark_core.modeling.compiled import CompiledStep, _core, cuda_capture  # noqa: E402
from dspark_core.modeling.model import LeanModel, rope_inv_freq  # noqa: E402

SHAPES = json.loads((Path(__file__).with_name("gpu_step_models.json")).read_text())
VARIANTS = ("eager", "eager+graph", "compiled", "compiled+graph")


@dataclasses.dataclass
class Case:
    model: str
    rows: int  # requests in the step
    tokens: int  # tokens per request (1 = plain decode, 9 = verify 8 drafts + the anchor)
    limit_ms: float  # bytes the step must read / measured bandwidth
    ms: dict[str, float] = dataclasses.field(default_factory=dict)  # variant -> step time
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # variant -> why it has no time
    compile_s: float = math.nan  # first call of the compiled step (compiling this shape)


def build(name: str, dtype: torch.dtype, device: str) -> LeanModel:
    """A LeanModel of shape `name` with random weights, built on `device` directly."""
    fields = {f.name for f in dataclasses.fields(ArchConfig)}
    arch = ArchConfig(**{k: v for k, v in SHAPES[name].items() if k in fields})
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LeanModel(arch)
    finally:
        torch.set_default_dtype(old)
    model.inv_freq = rope_inv_freq(arch).to(device)
    return model.eval()


def step_bytes(model: LeanModel, rows: int, context: int) -> int:
    """Weights of every projection and the LM head, plus K and V of `context` positions per row."""
    a = model.arch
    weights = sum(m.weight.numel() * m.weight.element_size() for m in linears(model))
    kv = rows * context * a.num_hidden_layers * 2 * a.num_key_value_heads * a.head_dim * model.dtype.itemsize
    return weights + kv


def graphed(run: Callable[[], Any]) -> Callable[[], Any]:
    """`run` captured in a CUDA graph as the engine captures its steps (compiled.cuda_capture); returns the replay.
    On a CPU (dry run) `run` itself, so the smoke test still calls the same tensor program."""
    return cuda_capture(run, None) if torch.cuda.is_available() else run


def measure(model: LeanModel, case: Case, context: int, bench: Callable[[Callable[[], Any]], float],
            variants: tuple[str, ...], cache, step: CompiledStep | None) -> None:
    """Fill case.ms for each variant (errors recorded, never raised: one failing way must not end the run)."""
    b, t, dev = case.rows, case.tokens, model.device
    tok = torch.randint(0, model.arch.vocab_size, (b, t))
    slots = list(range(b))
    tok_d = tok.to(dev)
    pos = (context + torch.arange(t))[None, :].expand(b, t).contiguous().to(dev)  # [B, T]
    idx = torch.arange(b, device=dev)
    span = torch.arange(context + t, device=dev)  # [Lk]
    ks, vs = [k[:b] for k in cache.k], [v[:b] for v in cache.v]

    def engine(use: CompiledStep | None) -> Callable[[], None]:
        def run() -> None:
            cache.lens[:b] = context
            model.compiled = use
            model(tok, cache, slots)
        return run

    for v in variants:
        try:
            with torch.inference_mode():
                if v == "eager":
                    fn = engine(None)
                elif v == "eager+graph":
                    fn = graphed(lambda: _core(model, tok_d, pos, idx, ks, vs, span, (), True))
                elif v == "compiled":
                    fn = engine(step)
                    t0 = time.perf_counter()
                    fn()
                    case.compile_s = time.perf_counter() - t0
                else:  # compiled+graph: the compiled _core (span dynamic, as the engine marks it) in a graph
                    torch._dynamo.mark_dynamic(span, 0)
                    fn = graphed(lambda: step.fn(model, tok_d, pos, idx, ks, vs, span, (), True))
                case.ms[v] = bench(fn)
        except Exception as e:  # noqa: BLE001 - recorded per variant, shown in the table
            case.errors[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
            print(f"  {case.model} {b}x{t} {v}: {case.errors[v]}", file=sys.stderr)
        finally:
            model.compiled = None


def markdown(cases: list[Case], header: dict[str, Any]) -> str:
    lines = [f"### The engine's step on {header['gpu']} against the HBM limit", "",
             f"torch {header['torch']}; bf16 weights (random, real shapes); context {header['context']} cached "
             f"positions per row; copy bandwidth {header['copy_gbs']:.0f} GB/s (read + write). Each cell: step ms "
             f"(x the limit = bytes read / that bandwidth). `stream` = every projection once at one row "
             f"(F.linear).{' DRY RUN on CPU: timings meaningless.' if header['dry_run'] else ''}", "",
             "| model | rows x tokens | limit ms | " + " | ".join(VARIANTS) + " | compile s |",
             "|---|---|---:|" + "---:|" * len(VARIANTS) + "---:|"]
    for c in cases:
        cells = [f"{c.ms[v]:.3f} ({c.ms[v] / c.limit_ms:.2f}x)" if v in c.ms else ("error" if v in c.errors else "-")
                 for v in VARIANTS]
        comp = "-" if math.isnan(c.compile_s) else f"{c.compile_s:.0f}"
        lines.append(f"| {c.model} | {c.rows} x {c.tokens} | {c.limit_ms:.3f} | " + " | ".join(cells) + f" | {comp} |")
    lines.append("")
    for m, s in header.get("stream_ms", {}).items():
        lines.append(f"- {m}: stream {s:.3f} ms.")
    for m in dict.fromkeys(c.model for c in cases):
        one = {(c.rows, c.tokens): c for c in cases if c.model == m}
        for v in VARIANTS:
            p1, v9 = one.get((1, 1)), one.get((1, 9))
            if p1 and v9 and v in p1.ms and v in v9.ms:
                lines.append(f"- {m} {v}: verify 9 / plain 1 = {v9.ms[v] / p1.ms[v]:.2f}")
    errs = [f"- {c.model} {c.rows}x{c.tokens} {v}: {e}" for c in cases for v, e in c.errors.items()]
    return "\n".join(lines + (["", "Errors:", *errs] if errs else []) + [""])


def run(models: list[str], *, device: str, dry: bool, bench: Callable[[Callable[[], Any]], float], copy_gbs: float,
        context: int, rows: tuple[int, ...], compile_rows: tuple[int, ...], deadline: float,
        save: Callable[[list[Case], dict[str, Any]], None], header: dict[str, Any]) -> list[Case]:
    """Measure every model's cases until `deadline` (time.monotonic()), eager ways for every model first, then the
    compiled ones (each shape compiles); `save` after each case."""
    cases: list[Case] = []
    header.update(context=context, copy_gbs=copy_gbs, stream_ms={})
    built: dict[str, tuple[LeanModel, Any, CompiledStep]] = {}
    for name in models:
        t0 = time.perf_counter()
        model = build(name, torch.bfloat16, device)
        built[name] = (model, model.new_cache(max(rows), context + 32), CompiledStep(model, sizes=(1, 9)))
        lins = linears(model)
        xs = [torch.randn(1, m.in_features, dtype=model.dtype, device=device) for m in lins]

        def stream(lins=lins, xs=xs) -> None:
            with torch.inference_mode():
                for m, x in zip(lins, xs, strict=True):
                    m(x)

        header["stream_ms"][name] = bench(stream)
        print(f"{name}: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    todo = [(m, b, t, ("eager", "eager+graph")) for m in models for b in rows for t in (1, 9)]
    todo += [(m, b, t, ("compiled", "compiled+graph")) for b in compile_rows for m in models for t in (1, 9)
             if b in rows]
    for name, b, t, variants in todo:  # on a CPU (dry run) the graph ways are the same calls, not captured
        if time.monotonic() > deadline:
            print(f"{name}: time budget spent, {b}x{t} {'/'.join(variants)} not run", file=sys.stderr)
            continue
        model, cache, step = built[name]
        case = next((c for c in cases if (c.model, c.rows, c.tokens) == (name, b, t)), None)
        if case is None:
            case = Case(name, b, t, step_bytes(model, b, context) / (copy_gbs * 1e9) * 1e3)
            cases.append(case)
        t1 = time.perf_counter()
        measure(model, case, context, bench, variants, cache, step)
        print(f"{name} {b}x{t} {'/'.join(variants)}: {time.perf_counter() - t1:.1f} s", file=sys.stderr)
        save(cases, header)
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-8b,smollm2-135m", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--compile-rows", default="1,8", help="rows also run compiled (each shape compiles once)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no case after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="CPU, the tiny shape, graphs not captured")
    ap.add_argument("--out")
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args(argv)
    if not a.dry_run and not torch.cuda.is_available():
        print("gpu_step.py: no CUDA GPU here; run on a GPU machine, or --dry-run for the CPU smoke test",
              file=sys.stderr)
        return 2
    unknown = [m for m in a.models.split(",") if m not in SHAPES or m.startswith("_")]
    if unknown:
        print(f"gpu_step.py: --models: unknown {', '.join(unknown)}; use {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    from gpu_kernels import copy_bandwidth_gbs, timer, write_atomic

    device = "cpu" if a.dry_run else "cuda"
    bench = timer(a.dry_run)
    header = {"gpu": "CPU (dry run)" if a.dry_run else torch.cuda.get_device_name(0), "torch": torch.__version__,
              "dry_run": a.dry_run}

    def save(cases: list[Case], hdr: dict[str, Any]) -> None:
        if a.out:
            write_atomic(a.out, markdown(cases, hdr))
        if a.json_path:
            write_atomic(a.json_path, json.dumps({"header": hdr, "cases": [dataclasses.asdict(c) for c in cases]},
                                                 indent=1))

    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    cases = run(["tiny"] if a.dry_run else a.models.split(","), device=device, dry=a.dry_run, bench=bench,
                copy_gbs=copy_bandwidth_gbs(device, a.dry_run, bench), context=64 if a.dry_run else a.context,
                rows=(1, 2) if a.dry_run else ints(a.rows), compile_rows=(1,) if a.dry_run else ints(a.compile_rows),
                deadline=time.monotonic() + a.budget_s, save=save, header=header)
    print(markdown(cases, header))
    return 0 if cases and not any(c.errors.get("eager") for c in cases) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
