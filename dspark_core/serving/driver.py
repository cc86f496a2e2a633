"""The engine's loop in one background thread, fed by the HTTP handlers.

Handlers `submit` a request and read its chunks from an asyncio queue; the thread admits what arrived, runs
`Engine.step`, turns committed tokens into text deltas (holding back an incomplete UTF-8 character, cutting at
stop strings) and hands them to the event loop. Only this thread touches the engine.

A step that raises fails only the requests it held (each gets an error naming itself: a 500, or an error event on
its stream) and the loop goes on with the queue, so one bad request cannot stop the server for the others; /health
turns 503 only after FAILING_STEPS steps in a row failed (the engine itself is broken).

The loop runs on `worker`, a one-thread executor; `serve` builds and warms the engine on that same thread, so every
torch call of the process runs on one thread. With libgomp (torch's OpenMP on Linux) each thread that runs a
parallel op keeps its own team of worker threads, and once the teams together outnumber the cores, idle workers
stop spinning and each parallel op waits for a futex wake-up: SmolLM2-135M's bf16 step at 8 requests took 1.3-1.4x
as long on a second thread as on the thread that loaded the model (2 threads, AVX512, 2026-12-04)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dspark_core.errors import DSparkError
from dspark_core.pystack import on_deep_stack

log = logging.getLogger("dspark.serve")
FAILING_STEPS = 3  # consecutive failed steps after which the engine reports itself unhealthy

if TYPE_CHECKING:
    from dspark_core.engine import Engine, Output
    from dspark_core.serving.batcher import Batcher
    from dspark_core.serving.metrics import Metrics
    from dspark_core.verification.sampling import SamplingParams


@dataclass
class Chunk:
    """A piece of one request's output, in order; the last has `finish_reason` (or `error`)."""

    text: str  # new text since the previous chunk
    tokens: int  # completion tokens so far
    finish_reason: str | None = None  # "stop" or "length" on the last chunk
    error: str | None = None  # the request failed inside the engine, or was ended by the shutdown
    status: int = 500  # the HTTP status a non-streaming request answers with on an error


@dataclass
class _Stream:
    """Detokenisation state of one live request."""

    out: asyncio.Queue[Chunk]
    stops: list[str]
    prompt_tokens: int = 0
    admitted: bool = False  # its prompt was prefilled (counted once)
    tokens: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the decoded text already sent


class Driver:
    """Runs the engine loop on `worker`; `submit` / `abort` / `stop` are safe to call from the event loop."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, worker: concurrent.futures.ThreadPoolExecutor,
                 metrics: Metrics | None = None, batcher: Batcher | None = None) -> None:
        self.engine, self.loop, self.metrics, self.batcher = engine, loop, metrics, batcher
        self._worker = worker  # the one-thread executor the loop runs on (its owner shuts it down)
        self._loop_done: concurrent.futures.Future | None = None  # the engine loop, once started
        self._seen: tuple[list[int], list[int]] = ([], [])  # engine.stats per-position counts at the last step
        self._steps, self._verified = 0, 0  # engine.stats steps and verify tokens at the last step
        self._inbox: queue.Queue[tuple[str, object]] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._stopping = threading.Event()
        self.error: str | None = None  # set while the engine is broken (FAILING_STEPS failed steps in a row)
        self._failed_steps = 0  # consecutive steps that raised
        self.failed_requests = 0  # requests ended by a failed step
        self._dead = False  # the loop has ended: new requests are answered at once

    def start(self) -> None:
        self._loop_done = self._worker.submit(on_deep_stack, self._run)  # no data-stack chunk churn per step

    @property
    def running(self) -> bool:
        """Whether the engine loop runs (it ends only at stop or when the engine is unusable)."""
        return self._loop_done is not None and not self._loop_done.done()

    def submit(self, rid: str, ids: list[int], sp: SamplingParams, stops: list[str]) -> asyncio.Queue[Chunk]:
        out: asyncio.Queue[Chunk] = asyncio.Queue()
        if self._dead:
            out.put_nowait(Chunk("", 0, error=self.error or "the engine has stopped", status=503))
            return out
        self._inbox.put(("add", (rid, ids, sp, _Stream(out, stops, len(ids)))))
        return out

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def abort_all(self, message: str, status: int = 503) -> None:
        """End every live request with `message` (its non-streaming answer gets `status`): the shutdown's deadline."""
        self._inbox.put(("abort_all", (message, status)))

    def reconfigure(self, spec: dict[str, object]) -> concurrent.futures.Future:
        """Engine.reconfigure on the engine thread, between steps; the future holds the new spec section or the
        DSparkError that refused it."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("config", (spec, done)))
        return done

    def stop(self, timeout: float | None = None) -> None:
        """Finish what is in flight, then end the thread."""
        self._stopping.set()
        self._inbox.put(("wake", None))
        if self._loop_done is not None:
            concurrent.futures.wait([self._loop_done], timeout)

    # -- the engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        while not (self._stopping.is_set() and not eng.has_work() and self._inbox.empty()):
            try:
                self._take(block=not eng.has_work())
                if eng.has_work():
                    self._batch()
                    updates = eng.step()
                    for u in updates:
                        self._emit(u.request_id, u.new_tokens, u.output)
                    self._observe()
                    if updates:  # healthy again only once a step made progress (an empty one proves nothing)
                        self._failed_steps, self.error = 0, None
                self._gauges()
            except Exception as exc:  # noqa: BLE001 - a failed step must not end the loop
                if not self._step_failed(exc):
                    break
        self._dead = self._dead or bool(self.error)
        while True:  # what arrived after the loop ended gets an answer instead of a hang
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                self._post(arg[3].out, Chunk("", 0, error=self.error or "the server is shutting down", status=503))

    def _step_failed(self, exc: Exception) -> bool:
        """Fail the requests the broken step held, each with an error naming it; keep the queue and the loop."""
        eng = self.engine
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        self._failed_steps += 1
        if self._failed_steps >= FAILING_STEPS:  # before any client hears of the failure: /health agrees at once
            self.error = f"the last {self._failed_steps} engine steps failed ({reason})"
        try:
            failed = eng.fail_in_flight()
        except Exception as again:  # noqa: BLE001 - the engine cannot even free its slots: it is broken
            self.error = f"engine unusable after a failed step ({reason}; then {type(again).__name__}: {again})"
            log.exception("engine step failed and could not recover")
            self._dead = True
            for rid in list(self._streams):
                self._send(rid, Chunk("", 0, error=self.error))
            return False
        names = [o.request_id for o in failed]
        log.error("engine step failed (%s); ending requests %s, the others go on", reason, ", ".join(names) or "-",
                  exc_info=exc)
        live = eng.live_ids()
        for out in failed:
            st = self._streams.pop(out.request_id, None)
            if st is not None:
                self._count(st, out)
                self._post(st.out, Chunk("", len(st.tokens), error=f"request {out.request_id} failed inside the "
                                                                    f"engine ({reason})"))
        for rid in [r for r in self._streams if r not in live]:  # ended mid-emit: nothing will answer them
            self._send(rid, Chunk("", 0, error=f"request {rid} failed inside the engine ({reason})"))
        self.failed_requests += len(failed)
        return True

    def _batch(self) -> None:
        """Apply the batcher's decision: the engine-wide block length, and a wait for more arrivals when idle."""
        if self.batcher is None:
            return
        eng = self.engine
        d = self.batcher.decide(time.perf_counter(), eng.num_running, eng.num_waiting)
        eng.gamma_cap, eng.admit_cap = d.gamma, d.cap
        deadline = time.perf_counter() + d.wait_s
        while eng.num_waiting < eng.config.batch.max_requests and (left := deadline - time.perf_counter()) > 0:
            self._take(block=True, timeout=left)

    def _gauges(self) -> None:
        """Running and waiting now, also when no step follows (an abort on an idle engine, the last request)."""
        if self.metrics:
            self.metrics.running.set(self.engine.num_running)
            self.metrics.waiting.set(self.engine.num_waiting)

    def _observe(self) -> None:
        eng, st = self.engine, self.engine.stats
        if self.batcher is not None:
            acc, att = self._seen
            self.batcher.rounds([n - (acc[k] if k < len(acc) else 0) for k, n in enumerate(st.pos_accepts)],
                                [n - (att[k] if k < len(att) else 0) for k, n in enumerate(st.pos_attempts)])
        self._seen = (list(st.pos_accepts), list(st.pos_attempts))
        if self.metrics:
            from dspark_core.drafters.suffix import suffix_stats

            block = eng.config.spec.block_size if eng.drafter else 0
            sps = self.batcher.sps if self.batcher is not None else None
            steps = st.steps - self._steps
            self.metrics.engine_step(st, eng.num_running, eng.num_waiting,
                                     block if eng.gamma_cap is None else min(block, eng.gamma_cap),
                                     self.batcher.switches if self.batcher else 0,
                                     sps((st.verify_tokens - self._verified) // steps) if sps and steps else None,
                                     eng.admit_cap if eng.admit_cap is not None else eng.config.batch.max_requests,
                                     getattr(eng.drafter, "proposers", None), suffix_stats(eng.drafter))
        self._steps, self._verified = st.steps, st.verify_tokens

    def _take(self, block: bool, timeout: float = 0.05) -> None:
        try:
            kind, arg = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if kind == "add":
                rid, ids, sp, stream = arg  # type: ignore[misc]
                try:
                    self.engine.add_request(ids, sp, request_id=rid)
                    self._streams[rid] = stream
                    if self.batcher is not None:
                        self.batcher.arrival(time.perf_counter())
                except DSparkError as e:  # the edge checks the prompt first, so this is a race or a bug
                    self._post(stream.out, Chunk("", 0, error=str(e), status=400))
                except Exception as e:  # noqa: BLE001 - refuse this request only
                    log.exception("request %s could not be queued", rid)
                    self._post(stream.out, Chunk("", 0, error=f"request {rid} could not be queued ({e})"))
            elif kind == "abort" and arg in self._streams:
                self._count(self._streams.pop(str(arg)), self.engine.abort(str(arg)))
            elif kind == "abort_all":
                message, status = arg  # type: ignore[misc]
                for rid in list(self._streams):
                    st = self._streams.pop(rid)
                    self._count(st, self.engine.abort(rid))
                    self._post(st.out, Chunk("", len(st.tokens), error=message, status=status))
            elif kind == "config":
                spec, done = arg  # type: ignore[misc]
                try:
                    done.set_result(self.engine.reconfigure(spec))
                except Exception as e:  # noqa: BLE001 - the caller answers it (DSparkError: 400, else 500)
                    done.set_exception(e)
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _emit(self, rid: str, new: list[int], output: Output | None) -> None:
        st = self._streams.get(rid)
        if st is None:
            return
        st.tokens.extend(new)
        if self.metrics:
            if not st.admitted:
                self.metrics.prompt_tokens.inc(st.prompt_tokens)
            self.metrics.generation_tokens.inc(len(new))
        st.admitted = True
        text = self.engine.tokenizer.decode(st.tokens) if self.engine.tokenizer else ""
        finish = output.finish_reason if output is not None else None
        for s in st.stops:
            at = text.find(s, max(0, st.sent - len(s) + 1))
            if at >= 0:
                text, finish = text[:at], "stop"
                if output is None:
                    output = self.engine.abort(rid)
                    if output is not None:
                        output.finish_reason = "stop"
                break
        if finish is None and text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its bytes
            text = text[: st.sent]
        elif finish is None and st.stops:  # hold back what could still become a stop string
            hold = max(len(s) for s in st.stops) - 1
            text = text[: max(st.sent, len(text) - hold)]
        delta, st.sent = text[st.sent:], max(st.sent, len(text))
        if finish is not None:
            del self._streams[rid]
            self._count(st, output)
        if delta or finish is not None:
            self._send(rid, Chunk(delta, len(st.tokens), finish), st)

    def _count(self, st: _Stream, output: Output | None) -> None:
        """A request left the engine: count it (a request aborted before its prefill still ran no tokens), and the
        gauges now, before its client hears of it."""
        self._gauges()
        if self.batcher is not None and output is not None and output.latency_s and output.ttft_s is not None:
            self.batcher.finished(output.latency_s - output.ttft_s)
        if self.metrics and output is not None:
            if not st.admitted and output.token_ids:
                self.metrics.prompt_tokens.inc(st.prompt_tokens)
            self.metrics.finished(output.finish_reason, output.ttft_s, output.latency_s, len(output.token_ids))

    def _send(self, rid: str, chunk: Chunk, st: _Stream | None = None) -> None:
        st = st or self._streams.pop(rid, None)
        if st is not None:
            self._post(st.out, chunk)

    def _post(self, out: asyncio.Queue[Chunk], chunk: Chunk) -> None:
        self.loop.call_soon_threadsafe(out.put_nowait, chunk)
