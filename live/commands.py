"""`loadgen` and `monitor`: commands over a live OpenAI-compatible deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kb.cli_common import DbOpt, JsonOpt, console, err_console, print_json
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
    api_key: Annotated[str | None, typer.Option(envvar="DSPARK_API_KEY", show_envvar=True,
                                                help="Send Authorization: Bearer KEY (a server started with "
                                                     "--api-key: ours, vLLM's or SGLang's).")] = None,
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
    target = Target.parse(url, model, api_key=api_key)
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


monitor_app = typer.Typer(help="Watch a server's Prometheus metrics (ours, vLLM's or SGLang's), store them in the "
                                 "knowledge base and compare them with a bundle's predictions.",
                            invoke_without_command=True, no_args_is_help=False)


@monitor_app.callback()
def monitor_cmd(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option("--url", help="The server (its base, /v1 or /metrics URL).")] = None,
    bundle: Annotated[Path | None, typer.Option(help="The bundle it serves (out/): compare with its predictions.")
                      ] = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between scrapes.")] = 5.0,
    samples: Annotated[int | None, typer.Option(min=1, help="Stop after this many scrapes.")] = None,
    duration: Annotated[float | None, typer.Option(min=0.0, help="Stop after this many seconds (default: "
                                                                 "Ctrl-C).")] = None,
    tolerance: Annotated[float, typer.Option(min=0.0, help="Relative difference from a prediction that counts "
                                                           "as drift.")] = 0.15,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Scrape a server's /metrics on an interval, store every sample, show a live view against the bundle's
    predictions and flag drift. Subcommands: report (PNG plots), list."""
    if ctx.invoked_subcommand is not None:
        return
    if url is None:
        raise ProfileError("monitor: give --url URL of the server to watch (or a subcommand: report, list)")
    from rich.live import Live

    from kb.db import open_db
    from kb.deployments import add_sample, start_deployment, window
    from live.monitor import compare, metrics_url, predictions, scrape, watch

    pred = predictions(bundle) if bundle is not None else {}
    target = metrics_url(url)
    first = scrape(target)  # fails with one line before anything is stored
    database = open_db(db)
    dep = start_deployment(database, target, first.kind, str(bundle) if bundle else None, pred or None)
    add_sample(database, dep, first)
    seen = [first]

    def view():  # noqa: ANN202 - rich Table
        return _monitor_table(dep, seen, pred, tolerance)

    with Live(view(), console=err_console, refresh_per_second=2, transient=json_out) as live:
        def on_sample(sample) -> None:  # noqa: ANN001 - live.scrape.Sample
            add_sample(database, dep, sample)
            seen.append(sample)
            live.update(view())

        watch(target, interval, None if samples is None else samples - 1, duration, on_sample, first_done=True)
    whole = window(seen[0], seen[-1])
    checks = compare(whole, pred, tolerance) if pred else []
    result = {"deployment_id": dep, "url": target, "kind": first.kind, "samples": len(seen), "window": whole,
              "drift": [c.metric for c in checks if c.drift],
              "non_finite_dropped": sum(s.non_finite for s in seen)}  # NaN / Inf values, never stored
    if json_out:
        print_json(result)
        return
    console.print(f"deployment {dep}: {len(seen)} samples of {target} stored; drift: "
                  f"{', '.join(result['drift']) or 'none'}" + ("" if pred else " (no --bundle to compare with)")
                  + (f"; {result['non_finite_dropped']} NaN / infinite value(s) dropped"
                     if result["non_finite_dropped"] else ""))


def _fmt(v) -> str:  # noqa: ANN001 - float | list | None
    if v is None:
        return "-"
    if isinstance(v, list):
        return " ".join(f"{x:.2f}" for x in v[:8]) + (" ..." if len(v) > 8 else "")
    return f"{v:,.2f}"


def _monitor_table(dep: int, seen: list, pred: dict, tolerance: float):  # noqa: ANN202 - rich Table
    from rich.table import Table

    from kb.deployments import window
    from live.monitor import compare

    last = window(seen[-2], seen[-1]) if len(seen) > 1 else {}
    whole = window(seen[0], seen[-1]) if len(seen) > 1 else {}
    table = Table(title=f"deployment {dep}: {len(seen)} samples ({seen[-1].kind})")
    for col in ("figure", "last interval", "whole watch", "predicted", "drift"):
        table.add_column(col)
    checks = {c.metric: c for c in compare(whole, pred, tolerance)} if whole else {}
    rows = [("tau", "tau"), ("p99 TPOT ms", "itl_p99_ms"), ("p99 TTFT ms", "ttft_p99_ms"),
            ("acceptance by position", "position_acceptance")]
    for label, key in rows:
        c = checks.get(label)
        drift = "-" if c is None or c.drift is None else "[red]DRIFT[/]" if c.drift else "ok"
        table.add_row(label, _fmt(last.get(key)), _fmt(whole.get(key)), _fmt(c.predicted if c else None), drift)
    for label, key in (("output tok/s", "output_tokens_per_s"), ("running", "running"), ("waiting", "waiting"),
                       ("finished", "finished"), ("429s", "rejected")):
        table.add_row(label, _fmt(last.get(key)), _fmt(whole.get(key)), "-", "-")
    return table


@monitor_app.command("list")
def monitor_list_cmd(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """The monitored deployments: id, URL, server family, bundle, samples."""
    from rich.table import Table

    from kb.db import open_db
    from kb.deployments import list_deployments

    rows = list_deployments(open_db(db))
    if json_out:
        print_json(rows)
        return
    table = Table(title="monitored deployments")
    for col in ("id", "url", "kind", "bundle", "samples", "started"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["deployment_id"]), r["url"], r["kind"], r["bundle"] or "-", str(r["samples"]),
                      r["started_at"][:19])
    console.print(table)


@monitor_app.command("report")
def monitor_report_cmd(
    deployment: Annotated[str, typer.Option(help="Deployment id, or latest.")] = "latest",
    out: Annotated[Path | None, typer.Option(help="PNG to write (default: monitor/monitor_<id>.png beside the "
                                                  "database; an existing file needs --force).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """PNG plots of a watched deployment over time: tau, acceptance by position, latency percentiles, load."""
    from kb.db import open_db
    from kb.deployments import deployment as load
    from kb.deployments import resolve
    from live.plots import report_png

    database = open_db(db)
    dep = resolve(database, deployment)
    info, samples = load(database, dep)
    if len(samples) < 2:
        raise ProfileError(f"deployment {dep} has {len(samples)} sample(s); a report needs two or more (monitor "
                           "with --samples 2 or more)")
    path = out or _reports_dir(db) / f"monitor_{dep}.png"
    if path.exists() and not force:
        raise ProfileError(f"--out {path} exists; pass --force to replace it or choose another file")
    whole = report_png(info, samples, path)
    if json_out:
        print_json({"deployment_id": dep, "png": str(path), "window": whole})
        return
    console.print(f"deployment {dep}: {len(samples)} samples -> {path}")


def _reports_dir(db: str | None) -> Path:
    """Where a report goes by default: monitor/ beside the SQLite database (the data folder for a server database),
    never the current folder."""
    from kb.db import default_url, resolve_url

    url = resolve_url(db)
    if not url.startswith("sqlite:///"):
        url = default_url()
    folder = Path(url.removeprefix("sqlite:///")).parent / "monitor"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProfileError(f"cannot create {folder} for the report ({e.strerror}); pass --out FILE") from None
    return folder


def register(app: typer.Typer) -> None:
    app.command("loadgen")(loadgen_cmd)
    app.add_typer(monitor_app, name="monitor")
