"""`serve`: the bundle's engine behind an OpenAI-compatible HTTP API (dspark_core/serving)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_core.errors import DSparkError


def serve_cmd(
    config: Annotated[Path, typer.Option("--config", help="The engine config to serve: a bundle's dspark.yaml.")],
    host: Annotated[str, typer.Option(help="Address to bind (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one, printed).")] = 8000,
    model: Annotated[str | None, typer.Option(help="Target checkpoint instead of the config's (a folder, a fetched "
                                                   "model or a cached id).")] = None,
    served_name: Annotated[str | None, typer.Option(help="The model id clients name (default: the checkpoint "
                                                         "folder's name).")] = None,
    max_waiting: Annotated[int, typer.Option(min=0, help="Requests queued beyond the running batch before new "
                                                         "ones get 429.")] = 64,
    grace: Annotated[float, typer.Option(min=0.0, help="Seconds in-flight requests get to finish after SIGTERM "
                                                       "or Ctrl-C.")] = 30.0,
    adaptive: Annotated[bool, typer.Option("--adaptive/--static", help="Adapt the batching timeout (bounded by "
                                           "batch.timeout_ms) and engine-wide speculation to the observed arrivals "
                                           "and the SPS table, or keep the config's values.")] = True,
    slo_ttft_ms: Annotated[float | None, typer.Option(min=1.0, help="Adaptive: refuse (429) a request whose "
                                                      "predicted TTFT exceeds this.")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(min=0.01, help="Adaptive: run at most the batch whose "
                                                      "predicted time per output token meets this.")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch CPU threads (default: torch's).")] = None,
    compile_steps: Annotated[bool | None, typer.Option("--compile/--no-compile", help="Decode / verify steps "
                                                       "through torch.compile, compiled at start-up (default: the "
                                                       "config's `compile`).")] = None,
    reconfigurable: Annotated[bool, typer.Option(help="Take POST /admin/spec: the verify-length settings change "
                                                      "between requests without a restart (tune --engine dspark "
                                                      "uses it); needs --api-key.")] = False,
    api_key: Annotated[str | None, typer.Option(envvar="DSPARK_API_KEY", show_envvar=True,
                                                help="Require Authorization: Bearer KEY on /v1/* and /admin/* (and "
                                                     "on /health, /metrics unless --open-endpoints names them).")
                       ] = None,
    open_endpoints: Annotated[str, typer.Option(help="Comma-separated endpoints that stay open with an API key: "
                                                     "health, metrics, or none.")] = "health,metrics",
    max_body_mb: Annotated[float, typer.Option(min=0.001, max=1024.0, help="Largest request body in MiB (413 past "
                                                                         "it, before it is read).")] = 8.0,
    limit_concurrency: Annotated[int, typer.Option(min=1, help="Most open connections and requests at once; past "
                                                              "it requests get 503 and new connections are "
                                                              "closed.")] = 1024,
    timeout_header: Annotated[float, typer.Option(min=0.1, help="Seconds a connection gets to send a request's "
                                                               "headers (and a body its bytes) before it is "
                                                               "closed (slow clients).")] = 10.0,
    timeout_keep_alive: Annotated[int, typer.Option(min=1, help="Seconds an idle keep-alive connection stays "
                                                              "open.")] = 5,
) -> None:
    """Serve the engine: /v1/completions, /v1/chat/completions (streaming or not), /v1/models, /health."""
    import signal
    import socket
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch
    import uvicorn

    from dspark_core.cli.commands import _config
    from dspark_core.engine import Engine
    from dspark_core.engine_parts import warm_steps
    from dspark_core.pystack import on_deep_stack
    from dspark_core.serving.app import ServeOptions, build_app
    from dspark_core.serving.guard import GuardOptions, is_loopback
    from dspark_core.serving.server import (
        ACCEPT_BURST,
        DrainingServer,
        connection_cap,
        protocol_class,
        raise_open_files,
    )

    if not config.is_file():
        raise DSparkError(f"--config {config}: no such file; pass a bundle's dspark.yaml (python cli.py tune "
                          "writes one to out/)")
    opened = {e.strip() for e in open_endpoints.split(",") if e.strip()} - {"none"}
    if opened - {"health", "metrics"}:
        raise DSparkError(f"--open-endpoints {open_endpoints!r}: name health, metrics or none")
    if api_key is not None and (not api_key.strip() or any(ord(c) < 33 or ord(c) == 127 for c in api_key)):
        raise DSparkError("--api-key / DSPARK_API_KEY: empty or holds spaces or control characters; use a printable "
                          "token")
    if reconfigurable and not api_key:
        raise DSparkError("--reconfigurable lets a client change the engine's settings: it needs --api-key (or "
                          "DSPARK_API_KEY), which /admin/spec then requires")
    loopback = is_loopback(host)
    if not loopback and not api_key:
        typer.echo(f"warning: binding {host} without an API key: anyone who reaches this port can use the server; "
                   "pass --api-key or DSPARK_API_KEY", err=True)
    if threads:
        torch.set_num_threads(threads)
    worker = ThreadPoolExecutor(1, thread_name_prefix="dspark-engine")  # every torch call: one thread (driver.py)
    cfg = worker.submit(on_deep_stack, _config, config, model).result()  # weights.dtype fastest times the target
    if compile_steps is not None:
        cfg.compile = compile_steps
    said = _startup_line(cfg)
    t0 = time.perf_counter()
    engine = worker.submit(on_deep_stack, Engine, cfg).result()
    if said:
        typer.echo(f"loaded in {time.perf_counter() - t0:.1f} s", err=True)
    if engine.target.compiled is not None:
        typer.echo(f"compiling the decode / verify / prefill steps (at most {cfg.compile_budget_s:g} s; cached on "
                   "disk) ...", err=True)
        typer.echo(worker.submit(on_deep_stack, warm_steps, engine).result(), err=True)
    name = served_name or Path(cfg.model.path).name
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        raise DSparkError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host") from None
    sock.listen(ACCEPT_BURST)  # connections wait in the backlog until uvicorn accepts them
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    connections = connection_cap(limit_concurrency, raise_open_files())

    def ready() -> None:
        from dspark_core.modeling import cpu_attention

        attention = cpu_attention.label(engine.target.device, engine.target.dtype)
        typer.echo(f"serving {name} ({engine.stats.method}, {engine.linear_kernel} linears, {attention}) on {url}",
                   err=True)

    guard = GuardOptions(max_body_bytes=int(max_body_mb * (1 << 20)), body_timeout_s=timeout_header,
                         api_key=api_key, open_paths=frozenset(f"/{e}" for e in opened), loopback_only=loopback)
    app = build_app(engine, ServeOptions(model_name=name, max_waiting=max_waiting, on_ready=ready, adaptive=adaptive,
                                         ttft_slo_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                                         tpot_slo_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None,
                                         reconfigurable=reconfigurable, guard=guard, grace_s=grace, worker=worker))
    server = DrainingServer(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                                           limit_concurrency=connections, timeout_keep_alive=timeout_keep_alive,
                                           backlog=ACCEPT_BURST,
                                           http=protocol_class(timeout_header, connections)),
                            app.state.drain)
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal after its graceful shutdown: a
        signal.signal(sig, lambda *_: None)  # drained stop is a normal exit (0), not a death by signal
    server.run(sockets=[sock])
    if server.ended_at_shutdown:
        typer.echo(f"stopped: {server.ended_at_shutdown} requests did not finish within --grace {grace:g} s and "
                   "were ended with an error", err=True)
    else:
        typer.echo("stopped: in-flight requests finished", err=True)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)


STARTUP_LINE_BYTES = 256 << 20  # loads smaller than this take well under a second: no start-up line


def _startup_line(cfg) -> bool:  # noqa: ANN001 - dspark_core.config.EngineConfig
    """One line before a load that takes time and memory (STARTUP_LINE_BYTES and up): what the engine will
    allocate, from the configs alone (dspark_core/preflight.py), so a bundle too big for the machine is visible
    before it grows. Returns whether it said it."""
    from dspark_core.memory import gib
    from dspark_core.preflight import engine_parts

    try:
        parts = engine_parts(cfg, None)
    except (DSparkError, OSError, ValueError):  # the load itself says what is wrong, in one line
        return False
    if sum(parts.values()) < STARTUP_LINE_BYTES:
        return False
    detail = ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if v)
    typer.echo(f"loading {cfg.model.path} on {cfg.device}: about {gib(sum(parts.values()))} ({detail}; "
               f"{cfg.batch.max_requests} requests x {cfg.model.max_seq_len} positions) ...", err=True)
    return True
