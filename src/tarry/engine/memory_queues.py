"""Local queues kept in memory (``[store] queues_in_memory``, the log store's default): a release,
a receive and an ack of a plain message without a transaction of the queue database each.

- **Release** (``release``): plain due messages (``DueColumns`` of queues without a length
  limit, none expiring, none with a producer's id) go into ``QueueMemory`` in arrival order.
  The log store takes them out of circulation without writing their marker
  (``LeavingStore.leave``): a crash finds them due again, and releases them again.
- **Receive** (``take``): from memory while the queue database is known to hold nothing
  takeable of that queue (``Waiters.nothing_takeable``); else there first, as before, then
  from memory. Memory rows are newer than any ready row written out before them, so a queue
  keeps its order.
- **Ack** (``ack``): the log store's marker for each message, with the state ``acked``,
  appended to its next group and answered once written (and fsynced, as the store's
  ``fsync`` policy does: what an ack's commit in the queue database promised). Only its
  finished row, its record for ``retention_ms``, waits in memory: a crash can lose that
  record, never the ack.
- **Write-outs** (``write_out``): rows in flight ``WRITE_AFTER_S`` (so that the queue
  database keeps their visibility timeout), ready rows nobody took for ``READY_WRITE_AFTER_S``
  (a queue whose consumers are away; or all of them once more than ``MAX_READY_ROWS`` wait)
  and every acked row go to the queue database in one transaction, then the markers of the
  ready and in-flight ones are appended (deferred). Ready rows wait longer than rows in
  flight: a consumer a second behind still takes them from memory, instead of each message
  being written out and then received and acked in the database.
  Before anything else reads or writes the queue database (counts, the console, a nack,
  redrive, a queue's arguments or a policy changing), every row is written out: this class
  is the engine's ``QueueDatabase``, and only a release, a receive and an ack
  (``claims_aware`` writes, and the reads they make through ``database``) pass without it.
  So the queue database is the truth for everything else, a moment behind.

Why a message is never released twice: a message due after this process started
(``started_at_ms``) cannot have been released by an earlier one, so only such messages go
into memory; one released before a crash, its row in the queue database but its marker not
written, is due before the start and takes the database's path, which finds its row. So does
one whose marker failed in this process (``LeavingStore.may_leave``), one whose release
through the database failed, which may have committed all the same (``released_elsewhere``),
and one sent without a delay, which its send releases that way (the dispatcher may fetch it
meanwhile: the database's path makes one release of the two).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import secrets
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from tarry.engine.waiters import Waiters
from tarry.errors import TarryError
from tarry.model.due import DueColumns, ReadyColumns
from tarry.model.events import Event, EventRun
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.model.time import Clock
from tarry.queues import counts
from tarry.queues.catalog import Catalog
from tarry.queues.lag import QueueHead
from tarry.queues.memory import InFlight, QueueMemory, WriteOut
from tarry.queues.memory_writes import write_out
from tarry.queues.release_columns import rows_by_queue, takes_as_they_come
from tarry.queues.row_messages import ReceivedRows, RowMessages
from tarry.queues.sequence import Sequencer
from tarry.store.base import LeavingStore, QueueDatabase
from tarry.store.sql import QueueConnection
from tarry.store.sqlite.pending_receives import MIN_VISIBILITY_MS
from tarry.store.sqlite.rows import plain_released_rows

__all__ = ["MAX_READY_ROWS", "READY_WRITE_AFTER_S", "WRITE_AFTER_S", "MemoryQueues"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How long a row in flight stays in memory unless acked; acked rows go at least this often.
WRITE_AFTER_S = 0.2
#: How long a ready row waits in memory for a receive before it is written out; a crash
#: before then releases it again from the log store (it was never received).
READY_WRITE_AFTER_S = 2.0
#: Ready rows held past which every one is written out at the next write-out (memory's bound
#: when consumers fall far behind: ~1 KB a row).
MAX_READY_ROWS = 100_000
#: The queue database's state of each kind of row held here (``QueueMemory.sizes``).
_STATE_OF_KIND = {
    "ready": MessageState.READY.value,
    "in_flight": MessageState.DELIVERED.value,
    "acked": MessageState.ACKED.value,
}


class MemoryQueues:
    def __init__(
        self,
        db: QueueDatabase,
        store: LeavingStore,
        clock: Clock,
        catalog: Catalog,
        seq: Sequencer,
        waiters: Waiters,
        emit: Callable[[Sequence[Event]], None],
    ) -> None:
        #: The queue database itself (what the barrier stands in front of).
        self.database = db
        self.memory = QueueMemory()
        self._store = store
        self._clock = clock
        self._catalog = catalog
        self._seq = seq
        #: Receive ids: this process's own prefix, then a count (a receipt names its receive).
        self._receives = itertools.count(1)
        self._prefix = f"m{secrets.token_hex(6)}"
        self._waiters = waiters
        self._emit = emit
        #: Messages due after this are released here for the first time (module docstring).
        self.started_at_ms = 2**63 - 1
        #: Messages whose release through the database failed (``released_elsewhere``).
        self._via_db: set[str] = set()
        self._writing = asyncio.Lock()
        self._ticker: asyncio.Task[None] | None = None

    def __getattr__(self, name: str) -> Any:
        # What else callers and tests read of the queue database (its ``db``, its path).
        return getattr(self.__dict__["database"], name)

    # --- the QueueDatabase, with the barrier --------------------------------------------------
    async def open(self) -> None:
        await self.database.open()
        self.started_at_ms = self._clock.now_ms()

    async def drain(self) -> None:
        """Before the store closes: every row written out, their markers with them."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        try:
            await self.write_out_all()
        except TarryError as exc:  # their messages are due again at the next start
            log.warning("queues kept in memory not written out: %s", exc)

    async def close(self) -> None:
        await self.database.close()

    async def read(self, work: Callable[[QueueConnection], T]) -> T:
        await self.write_out_all()
        return await self.database.read(work)

    async def write(
        self,
        work: Callable[[QueueConnection], T],
        *,
        durable: bool = False,
        first: bool = False,
        claims_aware: bool = False,
    ) -> T:
        if not claims_aware:
            await self.write_out_all()
            self._waiters.forget_looks()
        return await self.database.write(
            work, durable=durable, first=first, claims_aware=claims_aware
        )

    async def purge_finished(self, *, before_ms: int, limit: int = 5000) -> int:
        return await self.database.purge_finished(before_ms=before_ms, limit=limit)

    async def read_beside(
        self, queue: str, work: Callable[[QueueConnection], T]
    ) -> tuple[T, int, int]:
        """``work``'s answer from the queue database alone, with the ready and in-flight rows
        of ``queue`` held here, nothing written out (a count the console polls). As in
        ``counts_by_state``, no write-out moves rows meanwhile."""
        async with self._writing:
            answer = await self.database.read(work)
            return answer, self.memory.ready_in(queue), self.memory.in_flight_in(queue)

    async def counts_by_state(self) -> dict[str, int]:
        """Messages per state, of the queue database and held here, with nothing written out
        (``/metrics`` reads this at every scrape). Each row is in one place, and only a
        write-out moves rows between them: none runs while the count holds its lock."""
        async with self._writing:
            by_state = await self.database.read(counts.by_state)
            for kind, rows in self.memory.sizes().items():
                state = _STATE_OF_KIND[kind]
                by_state[state] = by_state.get(state, 0) + rows
        return by_state

    async def check(self) -> list[str]:
        return await self.database.check()

    # --- release, receive, ack ----------------------------------------------------------------
    def released_elsewhere(self, ids: Sequence[str]) -> None:
        """A release of ``ids`` through the queue database failed: it may have committed all
        the same, so their next release takes that path again."""
        self._via_db.update(ids)

    def release(self, batch: Sequence[Message]) -> bool:
        """Release ``batch`` (claimed) into memory; False, with nothing done, where it must
        take the queue database's path."""
        if not isinstance(batch, DueColumns) or batch.message_id is not None:
            return False
        due_at = batch.deliver_at_ms
        if min(due_at) <= self.started_at_ms or any(e is not None for e in batch.expires_at_ms):
            return False
        # Sent without a delay: its send released it through the database, or is doing so.
        if any(map(operator.le, due_at, batch.sent_at_ms)):
            return False
        if not self._store.may_leave(batch.ids):
            return False
        if self._via_db and not self._via_db.isdisjoint(batch.ids):
            self._via_db.difference_update(batch.ids)
            return False
        by_queue = self._plain_queues(batch.destination)
        if by_queue is None:
            return False
        now = self._clock.now_ms()
        self._store.leave(batch.ids)
        columns = (batch.ids, batch.body, batch.sent_at_ms, due_at, batch.correlation_ids())
        for queue, rows in by_queue.items():
            part = columns if len(rows) == len(due_at) else _at(columns, rows)
            seqs = self._seq.next_many(len(rows))
            self.memory.put(queue, plain_released_rows(queue, now, part, seqs))
            ready = ReadyColumns(batch, rows, queue, now, [None] * len(rows))
            self._emit(EventRun("released", ready, now, queue))
        self._waiters.wake(set(by_queue), in_memory=True)
        self._tick()
        return True

    def _plain_queues(self, destinations: list[str]) -> dict[str, list[int]] | None:
        """The rows of ``destinations`` by queue, when each queue takes them as they come;
        None where one is missing, put-disabled, limited in length or has a TTL (the queue
        database's path refuses, drops or sweeps them)."""
        by_queue = rows_by_queue(destinations)
        for queue in by_queue:
            args = self._catalog.effective(queue)
            if args is None or not takes_as_they_come(args) or args.message_ttl_ms is not None:
                return None
        return by_queue

    def sizes(self) -> dict[str, int]:
        """Rows held by kind (``QueueMemory.sizes``)."""
        return self.memory.sizes()

    def ready_in(self, queue: str) -> int:
        """Ready rows of ``queue`` held here."""
        return self.memory.ready_in(queue)

    def takes(self, queue: str, *, visibility_ms: int) -> bool:
        """Whether a receive may take ``queue``'s rows from memory (a visibility timeout
        shorter than ``MIN_VISIBILITY_MS`` could end before its rows are written out)."""
        return visibility_ms >= MIN_VISIBILITY_MS and self.memory.ready_in(queue) > 0

    def take(self, queue: str, most: int, *, now_ms: int, visibility_ms: int) -> ReceivedRows:
        taken = self.memory.take(
            queue,
            most,
            receive_id=f"{self._prefix}{next(self._receives)}",
            now_ms=now_ms,
            visibility_ms=visibility_ms,
        )
        if taken:
            self._emit(EventRun("received", taken.messages, now_ms, queue))
            self._tick()
        return taken

    def split(self, receipts: Sequence[str]) -> tuple[list[str], list[str]]:
        """``receipts`` of rows in flight here, and the others."""
        here: list[str] = []
        elsewhere: list[str] = []
        for receipt in receipts:
            (here if self.memory.holds(receipt) else elsewhere).append(receipt)
        return here, elsewhere

    async def ack(self, queue: str, receipts: Sequence[str]) -> tuple[int, list[str]]:
        """Ack rows in flight here: their messages' markers written, then answered. Returns how
        many were acked and the receipts that name no message in flight here."""
        flights, unknown = self.memory.settle(queue, receipts)
        if not flights:
            return 0, unknown
        # Shielded: once let go of here, the rows' end runs its course whoever waits for it.
        await asyncio.shield(self._acked(queue, flights))
        return len(flights), unknown

    async def _acked(self, queue: str, flights: list[InFlight]) -> None:
        now = self._clock.now_ms()
        # Should the marker fail, the store has them due again (released again): not acked.
        await self._store.finish_left(
            [flight.row[0] for flight in flights],
            state=MessageState.ACKED,
            now_ms=now,
            durable=True,
        )
        self.memory.finish(flights, acked_at_ms=now)
        rows = [flight.row for flight in flights]
        received_at = [flight.received_at_ms for flight in flights]
        acked = RowMessages(rows, received_at, MessageState.ACKED)
        self._emit(EventRun("acked", acked, now, queue))
        self._tick()

    def with_head(self, queue: str, head: QueueHead, count_cap: int) -> QueueHead:
        """``head`` (the queue database's, ``queues.lag.read_head`` with ``count_cap``) with
        the ready rows held here: the oldest due of both, and both counted up to the cap (0:
        not counted)."""
        due = self.memory.oldest_due_ms(queue)
        if due is None:
            return head
        oldest = due if head.oldest_due_ms is None else min(due, head.oldest_due_ms)
        ready = min(count_cap, head.ready + self.memory.ready_in(queue))
        return QueueHead(oldest, ready)

    # --- write-outs ---------------------------------------------------------------------------
    async def write_out_all(self) -> None:
        """Every row held written to the queue database (the barrier)."""
        if len(self.memory):
            await self._write_out(self.memory.everything)

    async def write_out_ready(self, queue: str) -> None:
        """``queue``'s ready rows written out (a receive that takes from the queue database
        only: its visibility timeout is too short for memory)."""
        await self._write_out(partial(self.memory.ready_of, queue))

    async def write_out_older(self) -> None:
        """Ready rows ``READY_WRITE_AFTER_S`` old (all, past ``MAX_READY_ROWS``), rows in
        flight ``WRITE_AFTER_S``, and every acked row, written out."""
        now = time.monotonic()
        ready_before = (
            now if self.memory.sizes()["ready"] > MAX_READY_ROWS else now - READY_WRITE_AFTER_S
        )
        await self._write_out(lambda: self.memory.older(ready_before, now - WRITE_AFTER_S))

    async def _write_out(self, taking: Callable[[], WriteOut]) -> None:
        # Shielded: a caller cancelled (a client gone) must not put rows back into memory
        # while their transaction commits anyway; they would then be in both.
        await asyncio.shield(self._write_out_now(taking))

    async def _write_out_now(self, taking: Callable[[], WriteOut]) -> None:
        async with self._writing:
            out = taking()
            if not out:
                return
            try:
                await self.database.write(partial(_write, out=out), claims_aware=True)
            except BaseException:
                self.memory.put_back(out)
                raise
            # In the database now: a receive looks there again.
            self._waiters.wake(set(out.ready))
            for flight in out.in_flight:
                self._waiters.takeable_from(flight.queue, flight.visible_at_ms)
            try:
                await self._store.finish_left(
                    out.ids_to_end(),
                    state=MessageState.READY,
                    now_ms=self._clock.now_ms(),
                    durable=False,
                )
            except TarryError as exc:  # due again: ``may_leave`` sends them the database's way
                log.warning("released messages will be released again (no-ops): %s", exc)

    def _next_write_out_in(self) -> float:
        """Seconds until ``write_out_older`` takes a ready row or a row in flight (at most
        ``WRITE_AFTER_S``: acked rows go every tick, and a row handed out meanwhile may be
        due before the oldest ready one)."""
        now = time.monotonic()
        ready, handed_out = self.memory.oldest_since()
        due = [now + WRITE_AFTER_S]
        if handed_out is not None:
            due.append(handed_out + WRITE_AFTER_S)
        if ready is not None:
            too_many = self.memory.sizes()["ready"] > MAX_READY_ROWS
            due.append(now if too_many else ready + READY_WRITE_AFTER_S)
        return min(due) - now

    def _tick(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._write_out_while_held())

    async def _write_out_while_held(self) -> None:
        try:
            while len(self.memory):
                await asyncio.sleep(max(self._next_write_out_in(), WRITE_AFTER_S / 4))
                try:
                    await self.write_out_older()
                except TarryError as exc:  # held still: the next round tries again
                    log.warning("could not write the queues kept in memory out: %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            self._ticker = None


def _write(conn: QueueConnection, *, out: WriteOut) -> None:
    write_out(conn, out)


C = TypeVar("C", bound=tuple[list[Any], ...])


def _at(columns: C, rows: list[int]) -> C:
    """``columns`` at ``rows``."""
    return cast(C, tuple([column[row] for row in rows] for column in columns))
