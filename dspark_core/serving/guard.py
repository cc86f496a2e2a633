"""What every request passes before a route sees it (pure ASGI middleware, no body buffering beyond the cap):

- Host check: a server bound to a loopback address answers only requests whose Host header names a loopback
  address, so a web page cannot reach it by DNS rebinding (a hostile name that resolves to 127.0.0.1).
- Origin check: a browser's cross-site request carries an Origin header; a POST whose Origin is not this server's
  own address is refused, so a page on another site cannot drive the API (simple `text/plain` POSTs need no CORS
  preflight, so the browser would send them).
- API key: with `--api-key`, `/v1/*` and `/admin/*` need `Authorization: Bearer KEY` (vLLM's scheme); `/health` and
  `/metrics` are open unless the operator closes them.
- Body size: a declared Content-Length over the cap gets 413 before a byte of the body is read; a chunked body is
  counted as it arrives and refused at the cap. A body must arrive within `body_timeout_s`.

Errors are OpenAI-shaped JSON with one-line messages, like the routes' own."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = {"localhost", "localhost.", "127.0.0.1", "::1", "[::1]"}
PROTECTED_PREFIXES = ("/v1/", "/admin/")  # what the API key guards; also /v1 and /admin themselves


@dataclass
class GuardOptions:
    """The limits and the key; see the module docstring."""

    max_body_bytes: int = 8 << 20  # request bodies past this get 413
    body_timeout_s: float = 30.0  # a body that has not fully arrived by then gets 408
    api_key: str | None = None  # Bearer token for /v1/* and /admin/* (None: open)
    open_paths: frozenset[str] = field(default_factory=lambda: frozenset({"/health", "/metrics"}))
    loopback_only: bool = True  # bound to a loopback address: Host must name one


def is_loopback(host: str) -> bool:
    """Whether a bind address or Host name is this machine only."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES or name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name part of a Host header or an Origin URL's netloc (no port, brackets kept off)."""
    value = value.strip()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


async def _reply(send: Send, status: int, message: str, kind: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware applying GuardOptions to every HTTP request."""

    def __init__(self, app: ASGIApp, options: GuardOptions) -> None:
        self.app, self.o = app, options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path: str = scope.get("path", "")
        refusal = self._refusal(scope, headers, path)
        if refusal is not None:
            await _reply(send, *refusal)
            return
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                await _reply(send, 400, "Content-Length is not a number", "invalid_request_error")
                return
            if int(length) > self.o.max_body_bytes:
                await _reply(send, 413, f"the body has {int(length)} bytes; this server takes at most "
                                        f"{self.o.max_body_bytes} (serve --max-body-mb)", "invalid_request_error")
                return
        body = await self._read_body(receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, scope: Scope, headers: dict[str, str], path: str) -> tuple[int, str, str] | None:
        """(status, message, type) when the request is refused before its body is read."""
        if self.o.loopback_only:
            host = _host_name(headers.get("host", ""))
            if host and not is_loopback(host):
                return 403, (f"Host {host!r} is not this server's address (it listens on loopback only); "
                             "use 127.0.0.1 or localhost"), "permission_error"
        origin = headers.get("origin")
        if origin is not None and scope.get("method") not in ("GET", "HEAD", "OPTIONS"):
            o_host = _host_name(urlsplit(origin).netloc) if origin != "null" else ""
            own = _host_name(headers.get("host", ""))
            same = bool(o_host) and o_host.lower() == own.lower()
            if not same and not (self.o.loopback_only and o_host and is_loopback(o_host)):
                return 403, f"cross-site request from origin {origin[:100]!r} refused", "permission_error"
        if self.o.api_key and self._protected(path):
            auth = headers.get("authorization", "")
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self.o.api_key.encode()):
                return 401, "a valid API key is required: send Authorization: Bearer KEY", "authentication_error"
        return None

    def _protected(self, path: str) -> bool:
        if path in self.o.open_paths:
            return False
        return path.startswith(PROTECTED_PREFIXES) or path in ("/v1", "/admin") or path in ("/health", "/metrics")

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body within the cap and the deadline; None when refused (the reply was sent)."""
        parts, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.o.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await _reply(send, 408, f"the body did not arrive within {self.o.body_timeout_s:g} s",
                             "invalid_request_error")
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.o.max_body_bytes:
                await _reply(send, 413, f"the body passed {self.o.max_body_bytes} bytes; this server takes at most "
                                        f"that (serve --max-body-mb)", "invalid_request_error")
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body read already, then passes on what the client sends next (the
    disconnect a route waits for)."""
    sent = False

    async def inner() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return inner
