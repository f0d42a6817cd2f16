"""Moving dead letters out of a queue, inside one queue-database transaction (a ``QueueTxn``).

One ``RedriveChunk`` is one transaction's worth of a redrive (``tarry.engine.redrive`` runs
them): it locks the dead letters it takes (ready messages of the dead-letter queue), and for
each either moves it or says why not. Moving a dead letter, in that same transaction:

- writes the message it becomes (``tarry.model.redrive.redriven_copy``): straight into its local
  queue when it goes back to one with no delay; else as a scheduled row here when this database
  holds the scheduled messages too (``keep_scheduled``); else hands it to the caller, which
  keeps it in this transaction's outbox and then in the delayed store;
- ends the dead letter: state ``acked`` (taken out of its queue), body dropped, header
  ``tarry-redriven-to`` naming the new id, and a ``redriven`` event.

So a dead letter is moved once or not at all: the new message and the end of the old one
commit together, and a repeated request finds the old one gone from its queue.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from tarry.errors import DeliveryFailed
from tarry.model.message import Message
from tarry.model.redrive import REDRIVEN_TO, RedriveRequest, redriven_copy
from tarry.queues.txn import QUEUED_STATES, QueueTxn
from tarry.store.sql import SqlConnection, id_column, id_key, row_lock
from tarry.store.sqlite.rows import COLUMNS, SELECT_SQL, from_row, to_insert

__all__ = ["RedriveChunk", "last_position"]

_SEQ = COLUMNS.index("seq")
_STATE = COLUMNS.index("state")
_VISIBLE = COLUMNS.index("visible_at_ms")


def _takeable(now_ms: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The dead letters a redrive may take, as a consumer could: ready ones, and those in
    flight whose visibility timeout ended (each state on its own index)."""
    return (("state = 'ready'", ()), ("state = 'delivered' AND visible_at_ms <= ?", (now_ms,)))


def last_position(conn: SqlConnection, queue: str) -> int:
    """The position of the last message of ``queue`` (0 when it has none): a redrive without
    a cursor goes up to here and no further."""
    return max(
        int(
            conn.execute(
                f"SELECT coalesce(max(seq), 0) FROM messages WHERE queue = ? AND state = '{state}'",
                (queue,),
            ).fetchone()[0]
        )
        for state in QUEUED_STATES
    )


@dataclass
class RedriveChunk:
    """One transaction of a redrive of ``queue``. ``is_route(name)``: whether ``name`` is a
    route (a destination outside tarry); ``may_send(name)``: whether the caller's token may
    send there (None: no tokens)."""

    txn: QueueTxn
    request: RedriveRequest
    queue: str
    is_route: Callable[[str], bool]
    may_send: Callable[[str], bool] | None
    #: True when this database keeps scheduled messages itself (a store that shares it).
    keep_scheduled: bool
    moved: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    #: Scheduled rows written here (``keep_scheduled``): their due times wake the dispatcher.
    scheduled: list[Message] = field(default_factory=list)
    #: Messages for the delayed store kept elsewhere (the caller's outbox).
    outbox: list[Message] = field(default_factory=list)
    #: The queue position of the last dead letter this chunk looked at.
    last_seq: int = 0
    #: True when the range had no more dead letters than this chunk looked at.
    exhausted: bool = False

    def scan(self, *, after_seq: int, upper_seq: int, limit: int, most: int) -> None:
        """Look at up to ``limit`` dead letters after position ``after_seq`` (up to
        ``upper_seq``), in queue order, moving those the filters let through until ``most``
        were moved."""
        self.txn.flush()
        conn, lock = self.txn.conn, row_lock(self.txn.conn, skip_locked=True)
        found = [
            conn.execute(
                f"{SELECT_SQL} WHERE queue = ? AND {state} AND seq > ? AND seq <= ? "
                "ORDER BY seq LIMIT ?" + lock,
                (self.queue, *args, after_seq, upper_seq, limit),
            ).fetchall()
            for state, args in _takeable(self.txn.now_ms)
        ]
        rows = list(heapq.merge(*found, key=lambda row: row[_SEQ]))
        self.last_seq = after_seq
        self.exhausted = len(rows) < limit
        rows = rows[:limit]
        for row in rows:
            if self.moved >= most:
                self.exhausted = False
                return
            self.last_seq = int(row[_SEQ])
            message = from_row(row)
            if self.request.matches(message):
                self._move(message)

    def by_ids(self, ids: Sequence[str]) -> None:
        """Move each of the dead letters ``ids`` that is ready in this queue and passes the
        filters; the others are skipped (``not_found``, ``filtered``)."""
        self.txn.flush()
        conn = self.txn.conn
        marks = ", ".join("?" * len(ids))
        rows = conn.execute(
            f"{SELECT_SQL} WHERE {id_column(conn)} IN ({marks})" + row_lock(conn, skip_locked=True),
            [id_key(conn, i) for i in ids],
        ).fetchall()
        now = self.txn.now_ms
        found = {
            row[0]: from_row(row)
            for row in rows
            if row[_STATE] == "ready" or (row[_STATE] == "delivered" and row[_VISIBLE] <= now)
        }
        for message_id in ids:
            message = found.get(message_id)
            if message is None or message.queue != self.queue:
                self.skipped["not_found"] += 1
            elif not message.deaths:
                self.skipped["not_dead_lettered"] += 1
            elif not self.request.matches(message):
                self.skipped["filtered"] += 1
            else:
                self._move(message)

    def _move(self, dead: Message) -> None:
        txn, request = self.txn, self.request
        target = request.target_of(dead)
        if target is None:
            self.skipped["not_dead_lettered"] += 1
            return
        local = target in txn.catalog.queues
        if not local and not self.is_route(target):
            self.skipped["unknown_destination"] += 1
            return
        if self.may_send is not None and not self.may_send(target):
            self.skipped["not_authorized"] += 1
            return
        now = txn.now_ms
        due = now + request.delay_ms
        copy = redriven_copy(
            dead,
            new_id=txn.ids.new_due(now, due),
            destination=target,
            now_ms=now,
            deliver_at_ms=due,
        )
        if local and request.delay_ms == 0:
            conn = txn.conn
            conn.execute("SAVEPOINT redrive")
            try:
                txn.insert_and_enqueue(copy, target)
            except DeliveryFailed as exc:
                # The queue refused it (put-disabled, full under reject_publish): it stays.
                conn.execute("ROLLBACK TO redrive")
                conn.execute("RELEASE redrive")
                self.skipped[exc.reason] += 1
                return
            conn.execute("RELEASE redrive")
        elif self.keep_scheduled:
            txn.conn.execute(*to_insert(copy, dedupe=False))
            self.scheduled.append(copy)
        else:
            self.outbox.append(copy)
        self._end(dead, copy.id)
        self.moved += 1

    def _end(self, dead: Message, new_id: str) -> None:
        """The dead letter leaves its queue for good, naming what it became."""
        conn, now = self.txn.conn, self.txn.now_ms
        headers = {**dead.headers, REDRIVEN_TO: new_id}
        conn.execute(
            "UPDATE messages SET state = 'acked', body = NULL, receipt = NULL, headers = ?, "
            f"updated_at_ms = ? WHERE {id_column(conn)} = ?",
            (orjson.dumps(headers).decode(), now, id_key(conn, dead.id)),
        )
        dead.headers = headers
        self.txn.emit("redriven", dead, self.queue, new_id)
