"""A cap on open connections and a deadline for each request head, as uvicorn's HTTP protocol
has neither: it keeps a connection that never sends a byte open forever, and idle sockets
without bound exhaust the process's file descriptors until accept() fails in a loop.

At the cap, the connection that has waited longest for a request makes room for the new one
(as nginx reuses idle keep-alive connections when it runs out), so idle sockets can never
keep a fresh client out; only when every connection has a request running is the new one
closed at once."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from tarry.server.refusals import RefusalLog

__all__ = ["ConnectionGuard"]


class ConnectionGuard:
    """The open connections of one server, and which of them wait for a request head."""

    def __init__(self, *, max_connections: int, header_timeout_s: float, refusals: RefusalLog):
        self.max_connections = max_connections
        self._header_timeout_s = header_timeout_s
        self._refusals = refusals
        self._open: set[H11Protocol] = set()
        # Connections waiting for a request head, oldest first, with the request cycle they
        # had then (a new cycle means a request arrived since) and their deadline.
        self._waiting: dict[H11Protocol, tuple[object, asyncio.TimerHandle]] = {}

    def protocol(self, parser: str = "h11", *, max_header_bytes: int | None = None) -> type[Any]:
        """uvicorn's protocol class for ``parser`` (``h11``, or ``httptools`` when installed),
        reporting to this guard. h11 enforces ``max_header_bytes`` itself (uvicorn's
        ``h11_max_incomplete_event_size``); for httptools the class counts the head."""
        guard = self
        base: type[Any] = H11Protocol
        if parser == "httptools":
            base = _head_limited(max_header_bytes)

        class Guarded(base):  # type: ignore[misc]
            def connection_made(self, transport: Any) -> None:
                super().connection_made(_JoinedWrites(transport, self.loop))
                guard._opened(self)

            def connection_lost(self, exc: Exception | None) -> None:
                guard._closed(self)
                super().connection_lost(exc)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                # A pipelined request may have started already: its head came in time.
                if not self.transport.is_closing() and _idle(self):
                    guard._wait_for_request(self)

        Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
        return Guarded

    def _opened(self, connection: H11Protocol) -> None:
        if len(self._open) >= self.max_connections and not self._close_oldest_waiting():
            self._refusals.note(
                "connection_cap",
                f"closed a new connection: all {self.max_connections} connections "
                "(server.max_connections) have a request running",
            )
            _close(connection)
            return
        self._open.add(connection)
        self._wait_for_request(connection)

    def _closed(self, connection: H11Protocol) -> None:
        self._open.discard(connection)
        waiting = self._waiting.pop(connection, None)
        if waiting is not None:
            waiting[1].cancel()

    def _wait_for_request(self, connection: H11Protocol) -> None:
        previous = self._waiting.pop(connection, None)
        if previous is not None:
            previous[1].cancel()
        deadline = connection.loop.call_later(self._header_timeout_s, self._expire, connection)
        self._waiting[connection] = (connection.cycle, deadline)

    def _still_waiting(self, connection: H11Protocol) -> bool:
        waiting = self._waiting.pop(connection, None)
        if waiting is None:
            return False
        waiting[1].cancel()
        return (
            connection.cycle is waiting[0]
            and _idle(connection)
            and not connection.transport.is_closing()
        )

    def _expire(self, connection: H11Protocol) -> None:
        if self._still_waiting(connection):
            self._refusals.note(
                "header_timeout",
                f"closed a connection that sent no request head within "
                f"{self._header_timeout_s:g}s (server.header_timeout_ms)",
            )
            self._drop(connection)

    def _close_oldest_waiting(self) -> bool:
        while self._waiting:
            oldest = next(iter(self._waiting))
            if self._still_waiting(oldest):
                self._refusals.note(
                    "connection_cap",
                    f"at {self.max_connections} connections (server.max_connections): closed "
                    "the one waiting longest for a request to make room",
                )
                self._drop(oldest)
                return True
        return False

    def _drop(self, connection: H11Protocol) -> None:
        self._open.discard(connection)
        _close(connection)


class _JoinedWrites:
    """A connection's transport whose writes in one turn of the loop go out as one: uvicorn
    writes a response as its head, then its body, and each write is a send() and (with
    TCP_NODELAY) a packet of its own. A write is held until the next one (both then go in one
    vectored send) or the end of the turn, whichever comes first."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self._flush)
            return
        self._held = None
        self._transport.writelines((held, data))

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def writelines(self, data: Any) -> None:
        self._flush()
        self._transport.writelines(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        closing: bool = self._transport.is_closing()
        return closing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _close(connection: H11Protocol) -> None:
    """Close a connection and take it out of uvicorn's count at once: ``connection_lost``,
    which would, comes a loop turn or more later (later still under uvloop), and meanwhile the
    closed connections would count against ``limit_concurrency`` (a 503 for a live client)."""
    connection.transport.close()
    connection.connections.discard(connection)


def _idle(connection: H11Protocol) -> bool:
    """No request running: none yet, or the last one answered."""
    return connection.cycle is None or connection.cycle.response_complete


def _head_limited(max_header_bytes: int | None) -> type[Any]:
    """uvicorn's httptools protocol refusing (400, as h11 does) a request line plus headers
    that has not ended within ``max_header_bytes``: httptools itself buffers a head without
    bound, so the bytes received while a head is incomplete are counted here."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    if max_header_bytes is None:
        return HttpToolsProtocol
    limit = max_header_bytes

    class HeadLimited(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = False
        _ended_here = False

        def on_message_begin(self) -> None:
            self._in_head, self._head_bytes = True, 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._ended_here = True
            super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            self._ended_here = False
            super().data_received(data)
            # A chunk that leaves a head unfinished counts whole, unless a message ended in it
            # (then it held that message's body too, and the new head counts from the next).
            if not self._in_head or self._ended_here or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > limit:
                message = "Invalid HTTP request received."  # as uvicorn words a bad head
                self.logger.warning(message)
                self.send_400_response(message)

    return HeadLimited
