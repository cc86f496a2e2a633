"""`estimate`: what one deployment of one speculative method does at one load, on the tuner's simulator
(tuner/estimate.py): per-GPU throughput, TPOT, TTFT, tau, and the speedup over the same deployment without
speculation."""

from __future__ import annotations

from typing import Annotated

import typer

from kb.cli_common import JsonOpt, console, print_json
from tuner.methods import METHODS


def estimate_cmd(
    model: Annotated[str, typer.Option(help="Model (catalogue name, e.g. qwen3-8b, deepseek-v3, or a folder).")],
    gpu: Annotated[str, typer.Option(help="GPU (catalogue name, e.g. h100, b200, mi300x).")],
    gpus: Annotated[int | None, typer.Option(help="Devices in the deployment (default: --tp).")] = None,
    tp: Annotated[int | None, typer.Option(help="Tensor parallelism (default: --gpus, else 1).")] = None,
    dtype: Annotated[str, typer.Option(help="Weight dtype: auto (the checkpoint's), bf16, fp8, int8, int4, "
                                            "nvfp4.")] = "auto",
    concurrency: Annotated[int, typer.Option(help="Concurrent requests (a closed loop).")] = 1,
    isl: Annotated[int, typer.Option(help="Input (prompt) tokens per request.")] = 1024,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 1024,
    method: Annotated[str, typer.Option(help=f"Speculative method: {'|'.join(METHODS)}.")] = "none",
    steps: Annotated[int | None, typer.Option(help="Draft tokens per round K (default: the method's usual: "
                                                   "dspark/dflash 7, eagle3/mtp 3, draft_model/ngram 4, "
                                                   "suffix 8).")] = None,
    topk: Annotated[int, typer.Option(help="EAGLE-3 tree branching per step (1: a chain).")] = 1,
    draft_tokens: Annotated[int, typer.Option(help="EAGLE-3 tree: tokens verified per request (incl. the "
                                                   "root).")] = 0,
    tau: Annotated[float | None, typer.Option(help="Mean accepted tokens per round, bonus included (default: the "
                                                   "model's published drafter, else the method's prior).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Estimate throughput (tok/s per GPU), TPOT, TTFT, tau and the speedup over --method none for one deployment,
    priced as SGLang runs the method (AIC's measured kernels where they cover the model and GPU)."""
    from tuner.estimate import Case, estimate

    case = Case(model=model, gpu=gpu, gpus=gpus, tp=tp, dtype=dtype, concurrency=concurrency, isl=isl, osl=osl,
                method=method, steps=steps, topk=topk, draft_tokens=draft_tokens, tau=tau)
    r = estimate(case)
    if as_json:
        print_json({k: r[k] for k in ("throughput", "tpot_ms", "ttft_ms", "tau", "speedup", "method", "steps",
                                      "running", "replicas", "acceptance", "cost_source", "none", "case")})
        return
    b = r["none"]
    console.print(f"[bold]{model}[/] on {r['case']['gpus'] or r['case']['tp'] or 1} x {gpu}, {method} "
                  f"(K {r['steps']}), concurrency {concurrency} ({r['running']} running), ISL {isl} / OSL {osl}")
    console.print(f"  throughput {r['throughput']:,.1f} tok/s/GPU   TPOT {r['tpot_ms']:.2f} ms   "
                  f"TTFT {r['ttft_ms']:.1f} ms   tau {r['tau']:.2f}")
    console.print(f"  without speculation: {b['throughput']:,.1f} tok/s/GPU, TPOT {b['tpot_ms']:.2f} ms   "
                  f"speedup [bold]{r['speedup']:.2f}x[/]")
    if r["acceptance"]:
        console.print(f"  acceptance: {r['acceptance']}", highlight=False)
    console.print(f"  cost: {r['cost_source']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)
