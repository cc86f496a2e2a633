"""How close the engine's step is to the weight-streaming limit of this CPU (issue 41, "know the limit").

For each dtype the engine runs on a CPU (fp32, bf16) and each linear kernel it has there (`torch`: `nn.Linear`, MKL
on the plain weight; `onednn`: weights pre-packed by oneDNN, dspark_core/modeling/cpu_linear.py, where this CPU
packs the dtype): the time to read the model's weights once at one row (every projection and the LM head, in the
model's order), and the limit is the fastest of those; then the lean model's own forward at one request (plain
decode), at 8 requests, and verifying 5 and 9 tokens of one request, each as a multiple of that limit, all
interleaved in one run (ratios, never absolute times: the cores are shared). `--compile` adds the same steps through
`torch.compile` (dspark_core/modeling/compiled.py). In bf16 where our attention kernel runs
(dspark_core/modeling/cpu_attention.py), `onednn-sdpa` is the onednn model with it off: SDPA's attention, as before.

    python benchmarks/step_limit.py [--threads 2] [--context 256] [--repeats 5] [--json] [--write]

Needs `python cli.py models fetch smollm2-135m`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


SHAPES = {"plain_1": (1, 1), "plain_8": (8, 1), "verify_5": (1, 5), "verify_9": (1, 9)}  # step -> (rows, tokens)
VERIFY = tuple(t for k, (_, t) in SHAPES.items() if k.startswith("verify"))  # also reported over plain 1


def linears(model) -> list[Any]:  # LeanModel -> its nn.Linear modules in forward order (gpu_step.py too)
    out = []
    for layer in model.layers:
        out += [layer.qkv, layer.o, layer.gate_up, layer.down]
    return [*out, model.lm_head]


def timers(model, context: int, compiled, kernel: str) -> dict[str, Any]:
    """name -> a callable that runs one step (streaming the weights, plain 1 / 8, verify 9) on a prepared cache,
    eager and, when `compiled` (a CompiledStep) is given, compiled; names are prefixed with `kernel`."""
    import torch

    lins = linears(model)
    xs = {id(m): torch.randn(1, m.in_features, dtype=model.dtype) for m in lins}
    cache = model.new_cache(8, context + 64)
    prompt = torch.randint(0, model.arch.vocab_size, (8, context))
    model(prompt, cache, list(range(8)))  # every slot holds `context` positions

    def stream() -> None:
        with torch.inference_mode():
            for m in lins:
                m(xs[id(m)])

    def step(b: int, t: int, use):
        tok = torch.randint(0, model.arch.vocab_size, (b, t))

        def run() -> None:
            model.compiled = use
            try:
                model(tok, cache, list(range(b)))
            finally:
                model.compiled = None
            for s in range(b):
                cache.truncate(s, context)
        return run

    out = {f"{kernel}_stream": stream, **{f"{kernel}_eager_{k}": step(b, t, None) for k, (b, t) in SHAPES.items()}}
    if compiled is not None:
        out |= {f"{kernel}_compiled_{k}": step(b, t, compiled) for k, (b, t) in SHAPES.items()}
    return out


def sdpa(fn):  # a step -> the same step with our attention kernel off (modeling/cpu_attention.py), then on again
    from dspark_core.modeling import cpu_attention

    def run() -> None:
        cpu_attention.use(False)
        try:
            fn()
        finally:
            cpu_attention.use(True)
    return run


def measure(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median ms per call of each function, interleaved round by round."""
    for fn in fns.values():
        fn()
    got: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            n, t0 = 0, time.perf_counter()
            while n < 3 or time.perf_counter() - t0 < 0.3:
                fn()
                n += 1
            got[k].append((time.perf_counter() - t0) / n * 1e3)
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--compile", action="store_true", help="also the compiled step (modeling/compiled.py)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="the RESULTS.md section")
    a = ap.parse_args()
    import torch

    from dspark_core.modeling import cpu_attention
    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.cpu_linear import pack_linears

    torch.set_num_threads(a.threads)
    cap = torch.backends.cpu.get_cpu_capability()
    folder = checkpoint_folder("smollm2-135m")
    rows = []
    for dt in a.dtypes.split(","):
        fns: dict[str, Any] = {}
        wbytes = 0
        for kernel in ("torch", "onednn"):
            model = load_model(folder, "cpu", dt)
            wbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears(model))
            if kernel == "onednn" and not pack_linears(model):
                print(f"{dt}: oneDNN does not pack {dt} on this CPU ({cap}); torch kernels only", file=sys.stderr)
                continue
            compiled = None
            if a.compile:
                from dspark_core.modeling.compiled import CompiledStep

                compiled = CompiledStep(model, sizes=(1, *VERIFY))  # as the engine: a graph per verify length
            fns |= timers(model, a.context, compiled, kernel)
            if kernel == "onednn" and dt == "bf16" and cpu_attention.load():  # the same steps on SDPA's attention
                fns |= {k.replace("onednn_", "onednn-sdpa_"): sdpa(fn) for k, fn in
                        timers(model, a.context, compiled, kernel).items() if not k.endswith("_stream")}
        t0 = time.perf_counter()
        for fn in fns.values():  # the first call of each compiled shape compiles it (or loads it from disk)
            fn()
        print(f"{dt}: first calls took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        ms = measure(fns, a.repeats)
        limit = min(v for k, v in ms.items() if k.endswith("_stream"))
        steps = {}
        for k in ms:
            if k.endswith("_plain_1"):
                p = k[: -len("plain_1")]  # "<kernel>_<eager|compiled>_"
                steps[p[:-1]] = {**{n: round(ms[p + n] / limit, 2) for n in SHAPES},
                                 **{f"verify{t}_over_plain1": round(ms[p + f"verify_{t}"] / ms[k], 2) for t in VERIFY}}
        rows.append({"dtype": dt, "ms": {k: round(v, 2) for k, v in ms.items()}, "limit_ms": round(limit, 2),
                     "stream_x_limit": {k[: -len("_stream")]: round(v / limit, 2) for k, v in ms.items()
                                        if k.endswith("_stream")},
                     "steps_x_limit": steps, "stream_gbs": round(wbytes / limit / 1e6, 1)})
        print(f"{dt}: {rows[-1]}", file=sys.stderr)
    from dspark_core.modeling.cpu_linear import supported

    result = {"capability": cap, "bf16_native": supported(torch.bfloat16), "threads": a.threads, "context": a.context,
              "rows": rows}
    if a.json:
        print(json.dumps(result))
    if a.write:
        write(result)
    return 0


def write(r: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_md import write_section

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    flag = " --compile" if any("compiled" in k for x in r["rows"] for k in x["steps_x_limit"]) else ""
    lines = [f"## The engine's step against the weight-streaming limit on {r['capability']} (issue 41, SmolLM2-135M, "
             f"{when})", "",
             f"`python benchmarks/step_limit.py{flag} --write` on a CPU with capability **{r['capability']}** "
             f"(oneDNN bf16 {'native: AVX512-BF16 / AMX' if r.get('bf16_native') else 'not native'}) "
             f"({r['threads']} threads, context {r['context']}). Limit = the fastest read of every projection's and "
             "the LM head's weights once at one row, over the engine's linear kernels (`torch`: `nn.Linear`; "
             "`onednn`: weights pre-packed by oneDNN, dspark_core/modeling/cpu_linear.py); steps are the lean "
             "model's forward, eager and (with `--compile`) through `torch.compile`, medians of interleaved "
             "repeats, as multiples of that limit.", "",
             "| dtype | kernel | step | limit ms | streamed GB/s | kernel's own read (x limit) | "
             + " | ".join([n.replace("_", " ") for n in SHAPES] + [f"verify {t} / plain 1" for t in VERIFY]) + " |",
             "|---|---|---|" + "---:|" * (3 + len(SHAPES) + len(VERIFY))]
    for row in r["rows"]:
        for name, x in row["steps_x_limit"].items():
            kernel, mode = name.split("_")
            cells = [x[n] for n in SHAPES] + [x[f"verify{t}_over_plain1"] for t in VERIFY]
            own = row["stream_x_limit"].get(kernel.split("-")[0], "-")  # onednn-sdpa: onednn's weights
            lines.append(f"| {row['dtype']} | {kernel} | {mode} | {row['limit_ms']} | {row['stream_gbs']} | {own} | "
                         + " | ".join(map(str, cells)) + " |")
    write_section(f"step_limit_{r['capability'].lower()}", "\n".join(lines))  # one section per CPU kind
    (ROOT / "benchmarks" / "results" / f"step_limit_{r['capability'].lower()}.json").write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    from dspark_core.pystack import on_deep_stack  # timing loops free of data-stack chunk churn (pystack.py)

    raise SystemExit(on_deep_stack(main))
