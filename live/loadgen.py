"""Drive an OpenAI-compatible endpoint (ours, vLLM's, SGLang's) and measure it from the client side.

Every request streams (`stream_options.include_usage`), so the client sees its first token (TTFT), its
inter-token gaps (TPOT = (end - first token) / (tokens - 1)) and the server's token count. Open loop: requests
start at Poisson arrival times whether or not earlier ones finished (TTFT then includes any wait for a client
thread); closed loop: C clients each send the next request when the previous one ends. Both stop at the request
count or the duration, whichever comes first; requests in flight at the deadline are waited for."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from live.traffic import Planned

OPEN_LOOP_THREADS = 256  # client threads of an open-loop run (requests beyond wait, and their TTFT shows it)
MAX_RESPONSE_BYTES = 1 << 20  # of a /v1/models answer


def server_json(raw: bytes) -> Any:
    """A JSON value a server sent, nesting bounded before json.loads recurses (dspark_core.jsonl); ValueError
    otherwise, which the callers record as the request's error."""
    from dspark_core.jsonl import JSON_DEPTH, json_depth

    if json_depth(raw) > JSON_DEPTH:
        raise ValueError(f"JSON nested deeper than {JSON_DEPTH} levels")
    return json.loads(raw)


@dataclass
class Record:
    """One request as the client saw it (seconds from the run's start)."""

    index: int
    start_s: float  # when it was due (open loop: its arrival) or sent (closed loop)
    status: int = 0  # HTTP status (0: no response)
    ttft_s: float | None = None  # start -> first text
    latency_s: float | None = None  # start -> last byte
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    retry_after: str | None = None  # a 429's Retry-After
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.status == 200 and self.finish_reason in ("stop", "length") and self.error is None


@dataclass
class Target:
    """Where requests go."""

    host: str
    port: int
    prefix: str  # path prefix before /completions, e.g. /v1
    model: str
    https: bool = False
    timeout_s: float = 600.0
    api_key: str | None = None  # sent as Authorization: Bearer (a server started with --api-key)

    def headers(self, **extra: str) -> dict[str, str]:
        """Request headers: the API key's, if any, and `extra`."""
        return ({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}) | extra

    @staticmethod
    def parse(url: str, model: str | None, timeout_s: float = 600.0, api_key: str | None = None) -> Target:
        from live.urls import server_url

        u = server_url(url)  # one line for a bad address ('not a url', a bad port), before any connection
        prefix = u.path.rstrip("/")
        prefix = prefix if prefix.endswith("/v1") else prefix + "/v1"
        t = Target(u.hostname, u.port or (443 if u.scheme == "https" else 80), prefix, model or "",
                   u.scheme == "https", timeout_s, api_key or None)
        if not model:
            t.model = t.first_model()
        return t

    def connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout_s)

    def first_model(self) -> str:
        from profiler.errors import ProfileError

        try:
            conn = self.connect()
            conn.request("GET", self.prefix + "/models", headers=self.headers())
            data = server_json(conn.getresponse().read(MAX_RESPONSE_BYTES))
            return str(data["data"][0]["id"])
        except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as e:
            raise ProfileError(f"cannot list the models at http://{self.host}:{self.port}{self.prefix}/models "
                               f"({e}); is the server up? (or pass --model)") from None


def _count(x: Any) -> int | None:
    """A token count a server reported, or None when it is not a non-negative integer."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def send(target: Target, req: Planned, rec: Record, t0: float, temperature: float, ignore_eos: bool) -> Record:
    """One streaming completion; fills `rec` (never raises)."""
    body = {"model": target.model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    conn = target.connect()
    chunks = 0
    try:
        conn.request("POST", target.prefix + "/completions", json.dumps(body),
                     target.headers(**{"Content-Type": "application/json", "Accept": "text/event-stream"}))
        resp = conn.getresponse()
        rec.status = resp.status
        if resp.status != 200:
            rec.retry_after = resp.getheader("Retry-After")
            rec.error = resp.read(4096).decode(errors="replace")[:300]
            return rec
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            msg = server_json(data.encode())
            if not isinstance(msg, dict):
                raise ValueError(f"a stream event is JSON {type(msg).__name__}, not an object")
            if "error" in msg:
                err = msg["error"]
                rec.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                break
            choices = msg.get("choices") or []
            if not isinstance(choices, list) or not all(isinstance(ch, dict) for ch in choices):
                raise ValueError("a stream event's choices are not a list of objects")
            for ch in choices:
                if ch.get("text") and rec.ttft_s is None:
                    rec.ttft_s = time.perf_counter() - t0 - rec.start_s
                chunks += bool(ch.get("text"))
                rec.finish_reason = ch.get("finish_reason") or rec.finish_reason
            use = msg.get("usage")
            if isinstance(use, dict):
                rec.prompt_tokens, rec.completion_tokens = _count(use.get("prompt_tokens")), _count(
                    use.get("completion_tokens"))
        if rec.completion_tokens is None:  # a server without usage in its stream: count the text chunks
            rec.completion_tokens = chunks
    except (OSError, ValueError, http.client.HTTPException) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        rec.latency_s = time.perf_counter() - t0 - rec.start_s
        conn.close()
    return rec


@dataclass
class Run:
    """A loadgen run: what was asked and every request's record."""

    url: str
    model: str
    workload: str
    mode: str  # "rate 4" / "rate 2@10,12@3" / "concurrency 8"
    duration_s: float  # wall time of the run
    records: list[Record] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.records if r.complete]
        tokens = sum(r.completion_tokens or 0 for r in ok)

        def pct(xs: list[float]) -> dict[str, float] | None:
            if not xs:
                return None
            s = sorted(xs)
            at = {q: s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] for q in (50, 90, 99)}
            return {"mean": round(statistics.fmean(s) * 1e3, 2)} | {f"p{q}": round(v * 1e3, 2) for q, v in at.items()}

        tpot = [(r.latency_s - r.ttft_s) / (r.completion_tokens - 1) for r in ok
                if r.ttft_s is not None and r.latency_s is not None and (r.completion_tokens or 0) > 1]
        return {
            "url": self.url, "model": self.model, "workload": self.workload, "mode": self.mode,
            "duration_s": round(self.duration_s, 3), "sent": len(self.records), "completed": len(ok),
            "rejected_429": sum(r.status == 429 for r in self.records),
            "failed": sum(not r.complete and r.status != 429 for r in self.records),
            "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / self.duration_s, 2) if self.duration_s else 0,
            "requests_per_s": round(len(ok) / self.duration_s, 3) if self.duration_s else 0,
            "ttft_ms": pct([r.ttft_s for r in ok if r.ttft_s is not None]),
            "tpot_ms": pct(tpot),
            "e2e_ms": pct([r.latency_s for r in ok if r.latency_s is not None]),
        }

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary(), "requests": [asdict(r) for r in self.records]}


def run(target: Target, plan: list[Planned], arrivals: list[float] | None, concurrency: int, duration_s: float,
        temperature: float = 0.0, ignore_eos: bool = False,
        on_done: Callable[[Record], None] | None = None) -> tuple[list[Record], float]:
    """Send the plan: at `arrivals` (open loop) or with `concurrency` clients (closed loop), until the plan or
    `duration_s` runs out. Returns the records in plan order and the wall time."""
    records: list[Record] = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    deadline = t0 + duration_s

    def one(req: Planned, start: float) -> None:
        rec = send(target, req, Record(req.index, start), t0, temperature, ignore_eos)
        with lock:
            records.append(rec)
        if on_done:
            on_done(rec)

    if arrivals is not None:
        with ThreadPoolExecutor(OPEN_LOOP_THREADS) as pool:
            for req, at in zip(plan, arrivals, strict=False):
                wait = t0 + at - time.perf_counter()
                if t0 + at > deadline:
                    break
                if wait > 0:
                    time.sleep(wait)
                pool.submit(one, req, at)
    else:
        queue = iter(plan)

        def client() -> None:
            while time.perf_counter() < deadline:
                with lock:
                    req = next(queue, None)
                if req is None:
                    return
                one(req, time.perf_counter() - t0)

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return sorted(records, key=lambda r: r.index), time.perf_counter() - t0
