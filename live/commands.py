"""`loadgen` (and `monitor`): commands over a live OpenAI-compatible deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kb.cli_common import JsonOpt, console, err_console, print_json
from profiler.errors import ProfileError

UrlOpt = Annotated[str, typer.Option("--url", help="The server, e.g. http://127.0.0.1:8000/v1 (ours, vLLM's or "
                                                   "SGLang's OpenAI-compatible API).")]


def loadgen_cmd(
    url: UrlOpt,
    workload: Annotated[str, typer.Option("--workload", "-w", help="Preset (chat, code, math, mixed) or a JSONL file "
                                                                   "of requests.")] = "chat",
    rate: Annotated[str | None, typer.Option(help="Open loop: Poisson arrivals per second, or phases RATE@SECONDS "
                                                  "cycled (2@10,12@3: bursts).")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Closed loop: clients, each sending its next "
                                                                "request when the last one ends.")] = None,
    duration: Annotated[float, typer.Option(min=0.1, help="Stop sending after this many seconds.")] = 60.0,
    requests: Annotated[int, typer.Option(min=1, help="Stop after this many requests.")] = 1000,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Cap every request's output tokens.")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature of every request.")] = 0.0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Ask for exactly max_tokens tokens (vLLM / "
                                                                  "SGLang / ours honour it).")] = False,
    model: Annotated[str | None, typer.Option(help="Model id to request (default: the server's first).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of output lengths and arrivals.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write the summary and every request's record as JSON.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Drive an OpenAI-compatible endpoint and report client-side TTFT / TPOT / throughput percentiles."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dspark_core.atomic import atomic_write_text
    from live.loadgen import Record, Run, Target, run
    from live.traffic import parse_rate, plan_requests, poisson_arrivals

    if (rate is None) == (concurrency is None):
        raise ProfileError("loadgen: give exactly one of --rate R (open loop) or --concurrency C (closed loop)")
    phases = parse_rate(rate) if rate is not None else None
    plan = plan_requests(workload, requests, max_tokens, seed)
    target = Target.parse(url, model)
    arrivals = poisson_arrivals(phases, len(plan), seed) if phases else None
    mode = f"rate {rate}" if rate is not None else f"concurrency {concurrency}"
    counts = {"ok": 0, "429": 0, "failed": 0}
    with Progress(TextColumn("[bold]loadgen[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=json_out, disable=json_out) as progress:
        task = progress.add_task(mode, total=len(plan))

        def done(rec: Record) -> None:
            key = "ok" if rec.complete else "429" if rec.status == 429 else "failed"
            counts[key] += 1
            progress.update(task, advance=1, description=f"{mode}: {counts['ok']} ok, {counts['429']} x 429, "
                                                         f"{counts['failed']} failed")

        records, wall = run(target, plan, arrivals, concurrency or 0, duration, temperature, ignore_eos, done)
    result = Run(url, target.model, workload, mode, wall, records)
    if out is not None:
        atomic_write_text(out, json.dumps(result.to_json(), indent=1) + "\n")
    summary = result.summary()
    if json_out:
        print_json(summary)
        return
    c = console
    c.print(f"[bold]{summary['completed']}/{summary['sent']}[/] complete, {summary['rejected_429']} x 429, "
            f"{summary['failed']} failed in {summary['duration_s']:.1f} s: {summary['output_tokens_per_s']:.1f} "
            f"output tok/s, {summary['requests_per_s']:.2f} req/s")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end")):
        p = summary[key]
        if p:
            c.print(f"{label:>10} ms: mean {p['mean']:.1f}  p50 {p['p50']:.1f}  p90 {p['p90']:.1f}  p99 {p['p99']:.1f}")
    if out is not None:
        c.print(f"records -> {out}")


def register(app: typer.Typer) -> None:
    app.command("loadgen")(loadgen_cmd)
