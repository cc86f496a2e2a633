"""uvicorn, bounded: the HTTP server `serve` runs the app in.

- Connections. Each connection must deliver a complete request head within `header_timeout_s` of opening (or of
  its previous response), else it is closed: slow-header clients (slowloris) cannot hold sockets. Past
  `max_connections` open sockets a new one is closed at once. asyncio accepts up to ACCEPT_BURST connections per
  wake-up before any of them is seen (and may do so twice more before the first are closed), so the cap leaves
  that many descriptors free beside FD_RESERVE: accept() never fails with "Too many open files" while normal
  requests wait. The open-file limit is raised to its hard limit at start, and libgcc_s is loaded at once, since a
  thread that exits while descriptors run out would otherwise abort the process (glibc loads it on pthread_exit).
- Shutdown. The first SIGTERM / Ctrl-C runs the app's drain (new requests 503, in-flight ones get the grace
  period, then each is ended with an error), then uvicorn's own shutdown, which then finds nothing to cancel; a
  second Ctrl-C exits at once."""

from __future__ import annotations

import asyncio
import resource
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

FD_RESERVE = 128  # descriptors kept free for model files, logs, the template renderer, the database
ACCEPT_BURST = 128  # connections asyncio accepts per wake-up (uvicorn's backlog; also the listen queue)


def raise_open_files() -> int:
    """Raise the soft open-file limit to the hard one; returns the limit now in force."""
    import ctypes
    import ctypes.util

    try:  # glibc dlopens libgcc_s when a thread exits; without a free descriptor that aborts the process
        ctypes.CDLL(ctypes.util.find_library("gcc_s") or "libgcc_s.so.1")
    except OSError:
        pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(limit_concurrency: int, open_files: int) -> int:
    """The most connections kept open: the operator's limit, within what the descriptors allow."""
    return max(8, min(limit_concurrency, open_files - FD_RESERVE - 3 * ACCEPT_BURST))


def protocol_class(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head deadline and a cap on open connections."""

    class BoundedH11(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()
                return
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            """Close the connection unless a new request head arrives in time (the cycle then changes)."""
            old = getattr(self, "_head_timer", None)
            if old is not None:
                old.cancel()
            cycle = self.cycle
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout, cycle)

        def _head_timeout(self, cycle: Any) -> None:
            if self.cycle is cycle and (cycle is None or cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return BoundedH11


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose shutdown first drains the app (`app.state.drain`)."""

    def __init__(self, config: uvicorn.Config, drain: Any) -> None:
        super().__init__(config)
        self._drain = drain
        self.ended_at_shutdown = 0  # requests the drain ended with an error at the deadline

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting before the grace period, not after it
            server.close()
        if not self.force_exit:
            drain = asyncio.ensure_future(self._drain())
            while not drain.done() and not self.force_exit:
                await asyncio.sleep(0.05)
            if drain.done():
                self.ended_at_shutdown = drain.result()
            else:
                drain.cancel()
        await super().shutdown(sockets)
