"""The OpenAI-compatible HTTP API over one engine: /v1/completions, /v1/chat/completions (SSE streaming or
not), /v1/models, /health, /metrics (Prometheus); with `serve --reconfigurable`, POST /admin/spec changes the
verify-length settings between requests (a live tuning study varies them within one server life).

Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with one-line messages: 400 for a
malformed body, unknown field, wrong type, out-of-range sampling field or a prompt that does not fit, 401 without
the API key, 403 for a foreign Host or Origin, 404 for another model's name, 413 for a body past the cap, 429 with
Retry-After when the queue is full, 500 naming the request when the engine failed it (the others go on), 503 while
shutting down. A client that disconnects aborts its request, which frees its slot. Text is tokenised and chat
templates rendered off the event loop, so /health answers while they run. `drain` is the shutdown: in-flight
requests get the grace period, then each is ended with an error (a 503, or an error event and [DONE])."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dspark_core.errors import DSparkError, EngineBusy
from dspark_core.pystack import on_deep_stack
from dspark_core.serving.batcher import Batcher
from dspark_core.serving.chat import TemplateFailed, TemplateRenderer
from dspark_core.serving.driver import Chunk, Driver
from dspark_core.serving.guard import Guard, GuardOptions
from dspark_core.serving.metrics import Metrics
from dspark_core.serving.protocol import ChatRequest, CompletionRequest, usage

if TYPE_CHECKING:
    from dspark_core.engine import Engine


@dataclass
class ServeOptions:
    """How the server admits work (the engine's own limits come from its config)."""

    model_name: str  # the id /v1/models lists and requests may name
    max_waiting: int = 64  # requests queued beyond the running batch before new ones get 429
    retry_after_s: int = 1  # the Retry-After a 429 carries
    on_ready: Callable[[], None] | None = None  # called once the engine thread runs (the server then accepts)
    adaptive: bool = True  # batching timeout, engine-wide speculation and SLO admission adapt to the load
    ttft_slo_s: float | None = None  # p99 TTFT target: a request predicted to miss it gets 429 (adaptive only)
    tpot_slo_s: float | None = None  # TPOT target: caps the running batch at what meets it (adaptive only)
    reconfigurable: bool = False  # POST /admin/spec changes the verify-length settings between requests
    guard: GuardOptions | None = None  # API key, Host / Origin checks, body cap (None: the defaults, no key)
    chars_per_token: int = 32  # a text prompt longer than this x max_seq_len characters is refused untokenised
    grace_s: float = 30.0  # at shutdown, how long in-flight requests get before they are ended with an error
    worker: ThreadPoolExecutor | None = None  # the thread that built the engine: its loop runs there (None: a new one)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def _error(status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
            415: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


def _one_line(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first validation problem as 'where: what'."""
    errs = exc.errors()
    if not errs:
        return "invalid request body", None
    first = errs[0].get("loc", ())[:2]  # the first field at fault; of a union's errors, the deepest is the one
    e = max((x for x in errs if x.get("loc", ())[:2] == first), key=lambda x: len(x.get("loc", ())))
    loc = [str(x) for x in e.get("loc", ()) if x != "body" and not _type_tag(x)]
    where = ".".join(loc) or "body"
    if e.get("type") == "json_invalid":
        return f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'parse error')})", None
    if e.get("type") == "extra_forbidden":
        return f"{where}: unknown field; see the OpenAI API reference for the accepted fields", where
    msg = " ".join(str(e.get("msg", "invalid")).removeprefix("Value error, ").split())[:300]
    if "unable to parse raw data as a unicode string" in msg:  # pydantic's words for a lone surrogate
        msg = "holds a lone surrogate or other invalid Unicode; send valid Unicode text"
    return f"{where}: {msg}", where


def _type_tag(part: object) -> bool:
    """A union member pydantic puts in an error's location (`str`, `list[int]`, `function-after[...]`)."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "list", "dict"))


def build_app(engine: Engine, options: ServeOptions) -> FastAPI:
    """The FastAPI app; its lifespan starts the engine thread (and the chat-template renderer); `app.state.drain`
    is the graceful shutdown `serve` runs on SIGTERM before the server stops."""
    state: dict[str, Any] = {"live": 0, "draining": False}
    metrics = Metrics(options.model_name, engine_info(engine))
    limit = engine.config.model.max_seq_len
    max_chars = limit * options.chars_per_token
    renderer = TemplateRenderer(engine.config.model.tokenizer or engine.config.model.path, max_chars + 1)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        worker = options.worker or ThreadPoolExecutor(1, thread_name_prefix="dspark-engine")
        # may profile: torch, on its thread
        batcher = await loop.run_in_executor(worker, on_deep_stack, make_batcher, engine, options)
        state["batcher"] = batcher
        await asyncio.to_thread(renderer.start)
        driver = Driver(engine, loop, worker, metrics, batcher)
        driver.start()
        state["driver"] = driver
        if options.on_ready:
            options.on_ready()
        yield
        await drain(0.0)  # what the server's own drain left (none after a SIGTERM); a no-op when idle
        await asyncio.to_thread(driver.stop)
        if options.worker is None:  # made here for an engine built on another thread
            worker.shutdown(wait=False)
        await asyncio.to_thread(renderer.close)

    async def drain(grace_s: float | None = None) -> int:
        """Refuse new work (503, /health 503), give in-flight requests `grace_s` (default: the options'), then end
        each that is left with a 503 or an error event; returns how many were ended."""
        state["draining"] = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (options.grace_s if grace_s is None else grace_s)
        while state["live"] and loop.time() < deadline:
            await asyncio.sleep(0.05)
        ended = state["live"]
        driver: Driver | None = state.get("driver")
        if ended and driver is not None:
            driver.abort_all(f"the server is shutting down: the request did not finish within the {options.grace_s:g}"
                             " s grace period; retry on another server", 503)
            flush = loop.time() + 5.0
            while state["live"] and loop.time() < flush:  # the handlers answer their clients
                await asyncio.sleep(0.02)
        return ended

    app = FastAPI(title="dspark-tune serve", lifespan=lifespan)
    app.state.drain = drain
    app.state.serving = state
    app.add_middleware(Guard, options=options.guard or GuardOptions())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _one_line(exc)
        return _error(400, message, param)

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # logged with its traceback by Starlette
        return _error(500, f"internal error handling {request.url.path} ({type(exc).__name__}); the server goes on")

    @app.get("/health")
    async def health() -> JSONResponse:
        driver: Driver = state["driver"]
        if driver.error or state["draining"] or not driver.running:
            return JSONResponse({"status": driver.error or ("draining" if state["draining"] else "stopped")},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/spec")
    async def reconfigure(request: Request) -> dict[str, Any]:
        """Engine.reconfigure: the body is a JSON object of spec fields (config.HOT_SPEC); the answer, the spec
        section now in force. 409 while requests are in flight. Only JSON bodies: a browser cannot send one
        cross-site without a CORS preflight, which this server never grants."""
        if not options.reconfigurable:
            raise ApiError(404, "this server does not take reconfigurations; start it with serve --reconfigurable")
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise ApiError(415, "send the spec fields as Content-Type: application/json")
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            raise ApiError(400, "the body is not valid JSON; send an object of spec fields") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object of spec fields, e.g. {\"scheduler\": \"prefix\"}")
        driver: Driver = state["driver"]
        try:
            spec = await asyncio.wrap_future(driver.reconfigure(body))
        except EngineBusy as e:
            raise ApiError(409, str(e)) from None
        except DSparkError as e:
            raise ApiError(400, str(e)) from None
        metrics.engine_info(engine_info(engine))
        return {"spec": spec.model_dump(mode="json")}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": options.model_name, "object": "model", "created": 0, "owned_by": "dspark-tune",
                "max_model_len": limit}
        return {"object": "list", "data": [card]}

    async def tokens(prompt: str | list[int]) -> list[int]:
        """The prompt's token ids; text longer than the context could hold is refused before it is tokenised, and
        tokenising runs off the event loop."""
        if not isinstance(prompt, str):
            return list(prompt)
        if engine.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer; send the prompt as token ids", "prompt")
        if len(prompt) > max_chars:
            raise ApiError(400, f"the prompt has {len(prompt)} characters; this model's context of {limit} tokens "
                                f"takes at most {max_chars} characters of text", "prompt")
        return await asyncio.to_thread(engine.tokenizer.encode, prompt)

    def admit(body: CompletionRequest | ChatRequest, ids: list[int], max_tokens: int | None):
        if not ids:
            raise ApiError(400, "the prompt is empty; send at least one token", "prompt")
        vocab = engine.target.arch.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ApiError(400, f"prompt token ids must lie in [0, {vocab})", "prompt")
        room = limit - len(ids) - 1
        if room < 1:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; this model's context is {limit} "
                                f"(max_seq_len), so at most {limit - 2} prompt tokens", "prompt")
        if max_tokens is not None and max_tokens > room:
            raise ApiError(400, f"max_tokens {max_tokens} + {len(ids)} prompt tokens exceed the context of {limit} "
                                f"tokens; ask for at most {room}", "max_tokens")
        if state["draining"]:
            raise ApiError(503, "the server is shutting down")
        cap = engine.config.batch.max_requests + options.max_waiting
        ahead = max(0, state["live"] - engine.config.batch.max_requests)
        ok, ttft = state["batcher"].admit(ahead)
        if not ok:
            metrics.rejected("predicted_ttft")
            raise ApiError(429, f"server busy: predicted TTFT {ttft * 1e3:.0f} ms exceeds the SLO of "
                                f"{options.ttft_slo_s * 1e3:.0f} ms; retry later",
                           headers={"Retry-After": str(options.retry_after_s)})
        if state["live"] >= cap:
            metrics.rejected("max_num_queued_reqs")
            raise ApiError(429, f"server busy: {state['live']} requests in flight (cap {cap}); retry later",
                           headers={"Retry-After": str(options.retry_after_s)})
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        return body.sampling(max_tokens or room, seed)

    def check_model(body: CompletionRequest | ChatRequest) -> None:
        if state["draining"]:
            raise ApiError(503, "the server is shutting down")
        if body.model not in (None, options.model_name):
            raise ApiError(404, f"model {body.model!r} is not served here; this server serves {options.model_name!r}",
                           "model")

    async def run(body: CompletionRequest | ChatRequest, request: Request, prompt: str | list[int],
                  max_tokens: int | None, chat: bool) -> Any:
        ids = await tokens(prompt)
        sp = admit(body, ids, max_tokens)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        driver: Driver = state["driver"]
        out = driver.submit(rid, ids, sp, body.stops())
        state["live"] += 1
        created = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(out, rid, created, len(ids), chat, include_usage),
                                     media_type="text/event-stream")
        try:
            text, last = await _collect(out, request, driver, rid)
        finally:
            state["live"] -= 1
        if last is None:  # the client went away
            return JSONResponse({}, status_code=499)
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": options.model_name, "choices": [choice], "usage": usage(len(ids), last.tokens)}

    async def _sse(out: asyncio.Queue[Chunk], rid: str, created: int, prompt_tokens: int, chat: bool,
                   include_usage: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        done = False
        try:
            if chat:
                yield _event(rid, kind, created, {"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None})
            while True:
                c = await out.get()
                if c.error:
                    yield "data: " + json.dumps({"error": {"message": c.error, "type": _kind(c.status),
                                                           "code": c.status}}) + "\n\n"
                    done = True
                    break
                choice: dict[str, Any] = {"index": 0, "finish_reason": c.finish_reason}
                if chat:
                    choice["delta"] = {"content": c.text} if c.text else {}
                else:
                    choice |= {"text": c.text, "logprobs": None}
                yield _event(rid, kind, created, choice)
                if c.finish_reason is not None:
                    done = True
                    if include_usage:
                        yield _event(rid, kind, created, None, usage(prompt_tokens, c.tokens))
                    break
            yield "data: [DONE]\n\n"
        finally:
            state["live"] -= 1
            if not done:  # disconnected mid-stream
                state["driver"].abort(rid)

    def _event(rid: str, kind: str, created: int, choice: dict[str, Any] | None,
               use: dict[str, int] | None = None) -> str:
        body: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": options.model_name,
                                "choices": [choice] if choice is not None else []}
        if use is not None:
            body["usage"] = use
        return "data: " + json.dumps(body) + "\n\n"

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body)
        return await run(body, request, body.prompt, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        check_model(body)
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        if sum(len(m["content"]) for m in messages) > max_chars:
            raise ApiError(400, f"the messages hold more than {max_chars} characters; this model's context of "
                                f"{limit} tokens takes at most that", "messages")
        try:
            prompt = await asyncio.to_thread(renderer.render, messages)
        except TemplateFailed as e:
            raise ApiError(500, str(e)) from None
        except DSparkError as e:
            raise ApiError(400, str(e), "messages") from None
        return await run(body, request, prompt, body.max_completion_tokens or body.max_tokens, chat=True)

    return app


def _kind(status: int) -> str:
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def engine_info(engine: Engine) -> dict[str, str]:
    """The labels of dspark:engine_info: what the engine runs."""
    spec = engine.config.spec
    return {"method": engine.stats.method, "head": spec.head,
            "block_size": str(spec.block_size if engine.drafter else 0), "scheduler": spec.scheduler}


def make_batcher(engine: Engine, options: ServeOptions) -> Batcher:
    """The batcher with the engine's SPS table: the config's (a bundle's sps.json), else profiled here."""
    from dspark_core.verification.sps import SpsTable

    c = engine.config
    gamma = c.spec.block_size if engine.drafter else 0
    sps = None
    if options.adaptive and (gamma or options.tpot_slo_s):
        if c.spec.sps_path:
            sps = SpsTable.load(c.spec.sps_path)
        else:
            from dspark_core.verification.verify_scheduler import profile_target_sps

            sps = profile_target_sps(engine.target, c.batch.max_requests * (gamma + 1), rows=c.batch.max_requests,
                                     affine=engine.target.device.type == "cpu")
    return Batcher(c.batch.max_requests, c.batch.timeout_ms / 1e3, gamma, sps, options.adaptive, options.ttft_slo_s,
                   tpot_slo_s=options.tpot_slo_s)


async def _collect(out: asyncio.Queue[Chunk], request: Request, driver: Driver,
                   rid: str) -> tuple[str, Chunk | None]:
    """All of a request's text; (text, None) when the client disconnected first (its request is aborted). The
    connection is checked every quarter second whether or not tokens arrive meanwhile."""
    parts: list[str] = []
    loop = asyncio.get_running_loop()
    next_check = loop.time() + 0.25
    while True:
        try:
            c = await asyncio.wait_for(out.get(), timeout=max(0.0, next_check - loop.time()))
        except asyncio.TimeoutError:
            c = None
        if c is None or loop.time() >= next_check:
            next_check = loop.time() + 0.25
            if await request.is_disconnected():
                driver.abort(rid)
                return "".join(parts), None
            if c is None and not driver.running:
                raise ApiError(503, f"request {rid}: the engine has stopped ({driver.error or 'shutdown'})")
        if c is None:
            continue
        if c.error:
            raise ApiError(c.status, c.error)
        parts.append(c.text)
        if c.finish_reason is not None:
            return "".join(parts), c
