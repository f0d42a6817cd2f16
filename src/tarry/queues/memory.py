"""``QueueMemory``: the rows of local queues held in memory instead of the queue database, so
that a release, a receive and an ack of a plain message cost a memory operation (and, for the
ack, a marker appended to the log store's next group) instead of a transaction each.

Per queue, the ready rows in arrival order; the rows handed out, by receipt; and the rows
acked since they were last written out. Each is a ``SELECT_SQL`` row, as the queue database
would read it back, so a receive's answer and its events are built from it as from a read.

What rows mean here, and when they go to the queue database, is ``tarry.engine.memory_queues``'s;
this module holds them and hands them over, and does no I/O.

A receipt here has no dot (``<receive id>-<seq>``): once its row is written out, the queue
database's receipt index finds it (``queues.receipts``: receipts without a dot are looked up
there).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tarry.queues.row_messages import ReceivedRows
from tarry.store.sqlite.rows import COLUMNS

__all__ = ["Finished", "InFlight", "QueueMemory", "Ready", "WriteOut"]

Row = tuple[Any, ...]
_SEQ = COLUMNS.index("seq")
_DELIVER_AT = COLUMNS.index("deliver_at_ms")


@dataclass(slots=True)
class Ready:
    """A ready row, and when it came (``time.monotonic``)."""

    row: Row
    since: float


@dataclass(slots=True)
class InFlight:
    """A row handed out under ``receipt``: invisible until ``visible_at_ms``."""

    queue: str
    row: Row
    receipt: str
    received_at_ms: int
    visible_at_ms: int
    since: float


@dataclass(slots=True)
class Finished:
    """A row acked at ``acked_at_ms``: written out once, for ``retention_ms``."""

    flight: InFlight
    acked_at_ms: int


@dataclass(slots=True)
class WriteOut:
    """Rows taken out of memory to be written to the queue database."""

    ready: dict[str, list[Row]] = field(default_factory=dict)
    in_flight: list[InFlight] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.ready or self.in_flight or self.finished)

    def ids_to_end(self) -> list[str]:
        """The messages whose store marker the write-out writes (acked ones have theirs)."""
        ids = [row[0] for rows in self.ready.values() for row in rows]
        ids += [flight.row[0] for flight in self.in_flight]
        return ids


class QueueMemory:
    def __init__(self) -> None:
        self._ready: dict[str, deque[Ready]] = {}
        self._in_flight: dict[str, InFlight] = {}
        self._finished: list[Finished] = []

    def __len__(self) -> int:
        """Rows held, of every kind."""
        return sum(self.sizes().values())

    def sizes(self) -> dict[str, int]:
        """Rows held by kind: ready, in flight, acked (not yet written out)."""
        return {
            "ready": sum(len(rows) for rows in self._ready.values()),
            "in_flight": len(self._in_flight),
            "acked": len(self._finished),
        }

    # --- release, receive, ack --------------------------------------------------------------
    def put(self, queue: str, rows: Iterable[Row]) -> None:
        """Ready rows entering ``queue``, in arrival order."""
        since = time.monotonic()
        self._ready.setdefault(queue, deque()).extend(Ready(row, since) for row in rows)

    def ready_in(self, queue: str) -> int:
        rows = self._ready.get(queue)
        return len(rows) if rows else 0

    def in_flight_in(self, queue: str) -> int:
        return sum(1 for flight in self._in_flight.values() if flight.queue == queue)

    def oldest_due_ms(self, queue: str) -> int | None:
        """The due time of the next ready row of ``queue`` (None: none)."""
        rows = self._ready.get(queue)
        return rows[0].row[_DELIVER_AT] if rows else None

    def take(
        self, queue: str, most: int, *, receive_id: str, now_ms: int, visibility_ms: int
    ) -> ReceivedRows:
        """Up to ``most`` ready rows of ``queue``, handed out, in arrival order. ``more``: whether
        it left any."""
        rows = self._ready.get(queue)
        if not rows:
            return ReceivedRows([], [], now_ms)
        since = time.monotonic()
        taken: list[Sequence[Any]] = []
        receipts: list[str] = []
        in_flight = self._in_flight
        visible_at = now_ms + visibility_ms
        for _ in range(min(most, len(rows))):
            row = rows.popleft().row
            receipt = f"{receive_id}-{row[_SEQ]}"
            in_flight[receipt] = InFlight(queue, row, receipt, now_ms, visible_at, since)
            taken.append(row)
            receipts.append(receipt)
        if not rows:
            del self._ready[queue]
        out = ReceivedRows(taken, receipts, now_ms)
        out.more = bool(rows)
        return out

    def holds(self, receipt: str) -> bool:
        return receipt in self._in_flight

    def settle(self, queue: str, receipts: Sequence[str]) -> tuple[list[InFlight], list[str]]:
        """The rows of ``queue`` in flight under ``receipts``, let go of; and the receipts that
        name none here (a receipt given twice names none the second time)."""
        flights: list[InFlight] = []
        unknown: list[str] = []
        in_flight = self._in_flight
        for receipt in receipts:
            flight = in_flight.get(receipt)
            if flight is None or flight.queue != queue:
                unknown.append(receipt)
            else:
                del in_flight[receipt]
                flights.append(flight)
        return flights, unknown

    def finish(self, flights: Iterable[InFlight], *, acked_at_ms: int) -> None:
        """Acked rows, kept until the next write-out."""
        self._finished.extend(Finished(flight, acked_at_ms) for flight in flights)

    # --- write-outs ---------------------------------------------------------------------------
    def older(self, ready_before: float, handed_out_before: float) -> WriteOut:
        """Taken out: ready rows that came before ``ready_before``, rows handed out before
        ``handed_out_before`` (``time.monotonic``), and every acked row."""
        out = WriteOut()
        for queue, rows in list(self._ready.items()):
            old: list[Row] = []
            while rows and rows[0].since <= ready_before:
                old.append(rows.popleft().row)
            if old:
                out.ready[queue] = old
            if not rows:
                del self._ready[queue]
        for receipt, flight in list(self._in_flight.items()):
            if flight.since > handed_out_before:
                break  # handed out in order: the rest are younger
            del self._in_flight[receipt]
            out.in_flight.append(flight)
        out.finished, self._finished = self._finished, []
        return out

    def ready_of(self, queue: str) -> WriteOut:
        """Taken out: the ready rows of ``queue``."""
        out = WriteOut()
        rows = self._ready.pop(queue, None)
        if rows:
            out.ready[queue] = [ready.row for ready in rows]
        return out

    def everything(self) -> WriteOut:
        """Taken out: every row held."""
        return self.older(float("inf"), float("inf"))

    def put_back(self, out: WriteOut) -> None:
        """A write-out that failed: its rows held again, where they were."""
        for queue, rows in out.ready.items():
            held = self._ready.setdefault(queue, deque())
            held.extendleft(Ready(row, 0.0) for row in reversed(rows))
        in_flight = {flight.receipt: flight for flight in out.in_flight}
        in_flight.update(self._in_flight)
        self._in_flight = in_flight
        self._finished[:0] = out.finished

    def oldest_since(self) -> tuple[float | None, float | None]:
        """When the oldest ready row came, and when the oldest row in flight was handed out
        (None: none)."""
        firsts = [rows[0].since for rows in self._ready.values() if rows]
        handed_out = next(iter(self._in_flight.values())).since if self._in_flight else None
        return (min(firsts) if firsts else None), handed_out
