"""Redrive across the stores: dead letters of a queue go back where they came from, each once.

A request runs as chunks, one queue-database transaction each (``tarry.queues.redrive``). Where
the moved message lands decides how a chunk commits:

- into a local queue with no delay: the same transaction puts it in its queue (every store: the
  local queues always live in the queue database);
- scheduled (a delay, or a route) on a store that shares the queue database (SQLite,
  PostgreSQL ``exactly_once``): the same transaction writes its scheduled row;
- scheduled on a store of its own (the log store, the memory store, PostgreSQL
  ``at_least_once``): the transaction writes it to an outbox table beside the dead letters it
  ends; then the delayed store keeps it (``store.store``); then the outbox rows go. A crash in
  between leaves outbox rows: ``resume`` (at start, and before every redrive) stores those the
  store does not hold yet and the queue database has not released, so none is lost and none
  is kept twice.

One redrive runs at a time in a process (the outbox is finished before the next one starts).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from tarry.engine.context import EngineContext
from tarry.engine.types import MayAccess
from tarry.errors import NotAuthorized, NotFound, UnknownDestination
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.redrive import RedriveCursor, RedriveRequest
from tarry.queues.outbox import create_outbox, drop_outbox, put_outbox, read_outbox
from tarry.queues.redrive import RedriveChunk, last_position
from tarry.store.sql import QueueConnection

__all__ = ["Redriver"]

log = logging.getLogger(__name__)

#: Dead letters one transaction looks at.
CHUNK = 500
#: Dead letters one request looks at, at most (a filter that lets few through answers with a
#: cursor instead of reading the whole queue in one request).
SCAN_LIMIT = 20_000


@dataclass
class Redriver:
    """A redrive gets the engine's context (its two databases, queue transactions and what runs
    after their commit, the dispatcher's due times) and how to tell a route."""

    ctx: EngineContext
    is_route: Callable[[str], bool]

    def __post_init__(self) -> None:
        self._lock = asyncio.Lock()
        # Picked once: where the store keeps scheduled messages decides whether a chunk that
        # schedules needs an outbox.
        self._outbox: _Outbox = _NoOutbox() if self.ctx.shared else _StoreOutbox(self.ctx)

    async def open(self) -> None:
        """Finish what a crash interrupted (before the dispatcher starts)."""
        await self._outbox.open()
        async with self._lock:
            await self._outbox.resume()

    async def redrive(
        self, queue: str, request: RedriveRequest, *, may_send: MayAccess | None
    ) -> dict[str, Any]:
        catalog = self.ctx.catalog
        if queue not in catalog.queues:
            raise NotFound(f"no queue named {queue!r}")
        for name, field in ((request.to, "to"), (request.original_destination, None)):
            if name is None:
                continue
            if may_send is not None and not may_send(name):
                raise NotAuthorized(
                    f"this token may not send to {name!r}; ask for a token with send "
                    "permission on it"
                )
            if field and catalog.kind(name) != "queue" and not self.is_route(name):
                raise UnknownDestination(
                    f"to {name!r} is no queue or route here; declare it or name another"
                )
        async with self._lock:
            await self._outbox.resume()
            return await self._run(queue, request, may_send)

    async def _run(
        self, queue: str, request: RedriveRequest, may_send: MayAccess | None
    ) -> dict[str, Any]:
        moved, skipped = 0, Counter[str]()
        if request.ids is not None:
            ids = list(request.ids)
            for start in range(0, len(ids), CHUNK):
                part = ids[start : start + CHUNK]
                chunk = await self._chunk(queue, request, may_send, partial(_by_ids, ids=part))
                moved, skipped = moved + chunk.moved, skipped + chunk.skipped
            return _answer(moved, skipped, None)
        if request.cursor is not None:
            after, upper = request.cursor.after_seq, request.cursor.upper_seq
        else:
            after, upper = 0, await self.ctx.qdb.read(lambda conn: last_position(conn, queue))
        looked = 0
        while True:
            limit = min(CHUNK, SCAN_LIMIT - looked)
            most = request.max - moved
            chunk = await self._chunk(
                queue,
                request,
                may_send,
                partial(_scan, after_seq=after, upper_seq=upper, limit=limit, most=most),
            )
            moved, skipped = moved + chunk.moved, skipped + chunk.skipped
            looked += limit
            after = chunk.last_seq
            if chunk.exhausted:
                return _answer(moved, skipped, None)
            if moved >= request.max or looked >= SCAN_LIMIT:
                return _answer(moved, skipped, RedriveCursor(after, upper).encode())

    async def _chunk(
        self,
        queue: str,
        request: RedriveRequest,
        may_send: MayAccess | None,
        step: Callable[[RedriveChunk], None],
    ) -> RedriveChunk:
        def work(conn: QueueConnection) -> RedriveChunk:
            chunk = RedriveChunk(
                self.ctx.txn(conn, self.ctx.clock.now_ms()),
                request,
                queue,
                is_route=self.is_route,
                may_send=may_send,
                keep_scheduled=self._outbox.keeps_scheduled,
            )
            step(chunk)
            if chunk.outbox:
                put_outbox(conn, chunk.outbox)
            return chunk

        # Not fsynced: a power loss undoes the whole chunk (the dead letters are back where
        # they were, nothing moved), which is still once. Only an outbox must be on disk
        # before the delayed store keeps its messages (else a power loss would leave them
        # kept and their dead letters back: twice).
        chunk = await self.ctx.qdb.write(work)
        if chunk.outbox:
            await self.ctx.qdb.write(_nothing, durable=True)
        self.ctx.after(chunk.txn)
        now = chunk.txn.now_ms
        if chunk.scheduled:
            _scheduled(self.ctx, chunk.scheduled, now)
        if chunk.outbox:
            await self._outbox.keep(chunk.outbox, now)
        if chunk.moved:
            log.info(
                "redrove %d dead letters of %s",
                chunk.moved,
                queue,
                extra={"destination": queue, "count": chunk.moved},
            )
        return chunk


def _scheduled(ctx: EngineContext, messages: list[Message], now: int) -> None:
    ctx.emit([("scheduled", m, now, None, None) for m in messages])
    ctx.due(min(m.deliver_at_ms for m in messages), now)


class _Outbox(Protocol):
    #: True: a chunk writes what it schedules in its own transaction (no outbox).
    keeps_scheduled: bool

    async def open(self) -> None: ...

    async def resume(self) -> None:
        """Keep what a crash left in the outbox (under the redriver's lock)."""
        ...

    async def keep(self, messages: list[Message], now: int) -> None:
        """The delayed store keeps a chunk's outbox messages, then the outbox lets them go."""
        ...


class _NoOutbox:
    """The store shares the queue database: a scheduled message is a row of it."""

    keeps_scheduled: bool = True

    async def open(self) -> None:
        """Nothing: no outbox."""

    async def resume(self) -> None:
        """Nothing: a chunk commits whole."""

    async def keep(self, messages: list[Message], now: int) -> None:
        raise AssertionError("a chunk fills no outbox where the store shares the queue database")


class _StoreOutbox:
    """The store keeps scheduled messages apart: a chunk's go through the outbox table."""

    keeps_scheduled: bool = False

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    async def open(self) -> None:
        await self.ctx.qdb.write(create_outbox, durable=True)

    async def keep(self, messages: list[Message], now: int) -> None:
        """The delayed store keeps the outbox's messages, then the outbox lets them go."""
        await self.ctx.store.store(messages)
        _scheduled(self.ctx, messages, now)
        ids = [m.id for m in messages]
        await self.ctx.qdb.write(lambda conn: drop_outbox(conn, ids))

    async def resume(self) -> None:
        """Outbox rows a crash left: keep in the store those it does not hold yet."""
        waiting = await self.ctx.qdb.read(read_outbox)
        if not waiting:
            return
        now = self.ctx.clock.now_ms()
        ids = [m.id for m in waiting]
        held = await self.ctx.qdb.read(lambda conn: self.ctx.txn(conn, now).released_before(ids))
        held |= await self._stored(waiting)
        missing = [m for m in waiting if m.id not in held]
        log.warning(
            "redrive outbox: %d messages a crash left, %d of them not yet kept: keeping them",
            len(waiting),
            len(missing),
        )
        if missing:
            await self.keep(missing, now)
        else:
            await self.ctx.qdb.write(drop_outbox)

    async def _stored(self, messages: list[Message]) -> set[str]:
        """Which of ``messages`` the delayed store holds: those of a chunk share a due time,
        so a listing of each due time finds them (one pass, not a look-up per id)."""
        wanted = {m.id for m in messages}
        found: set[str] = set()
        for due in sorted({m.deliver_at_ms for m in messages}):
            cursor = None
            while True:
                query = MessageQuery(
                    due_after_ms=due, due_before_ms=due + 1, limit=1000, cursor=cursor
                )
                items, cursor = await self.ctx.store.list(query)
                found.update(m.id for m in items if m.id in wanted)
                if cursor is None:
                    break
        return found


def _nothing(conn: QueueConnection) -> None:
    """A write that only waits for the fsync of what was committed before it."""


def _by_ids(chunk: RedriveChunk, *, ids: list[str]) -> None:
    chunk.by_ids(ids)


def _scan(chunk: RedriveChunk, *, after_seq: int, upper_seq: int, limit: int, most: int) -> None:
    chunk.scan(after_seq=after_seq, upper_seq=upper_seq, limit=limit, most=most)


def _answer(moved: int, skipped: Counter[str], cursor: str | None) -> dict[str, Any]:
    """The answer: ``next_cursor`` is null once the range is done (else pass it back to go on)."""
    data: dict[str, Any] = {
        "moved": moved,
        "skipped": sum(skipped.values()),
        "skipped_reasons": dict(sorted(skipped.items())),
    }
    data["next_cursor"] = cursor
    return data
