"""Due messages as columns, for the common release: plain messages (every optional field at its
default, never failed) that a store read back when they fell due. The dispatcher routes them,
the queue database writes them and the events tell them from the columns; ``DueColumns`` is
still a sequence of ``Message``s for whoever reads one (a refused message, an external route),
and ``ReadyColumns`` the released ones for a listener that reads messages, each made only when
first read (``LazyMessages``), as ``AcceptedColumns.messages`` does for sends.

What does not fit (headers, a producer id, a failure counted, ...) comes back as ``Message``s.
"""

from __future__ import annotations

from itertools import repeat
from typing import TypeVar

from tarry.model.lazy_messages import LazyMessages, PlainLines
from tarry.model.message import Message, plain_message
from tarry.model.state import MessageState

__all__ = ["DueColumns", "ReadyColumns"]

_T = TypeVar("_T")


class DueColumns(LazyMessages):
    """Plain scheduled messages, row ``k`` of each column being message ``k``; as messages,
    each is ``plain_message`` of its row. ``message_id`` and ``correlation_id``: each one's
    producer ids (an idempotent producer's key, a saga's id), each None for a batch where none
    has one."""

    __slots__ = (
        "body",
        "correlation_id",
        "deliver_at_ms",
        "destination",
        "expires_at_ms",
        "ids",
        "message_id",
        "sent_at_ms",
    )

    def __init__(
        self,
        ids: list[str],
        destination: list[str],
        body: list[bytes],
        sent_at_ms: list[int],
        deliver_at_ms: list[int],
        expires_at_ms: list[int | None],
        message_id: list[str | None] | None = None,
        correlation_id: list[str | None] | None = None,
    ) -> None:
        super().__init__()
        self.ids = ids
        self.destination = destination
        self.body = body
        self.sent_at_ms = sent_at_ms
        self.deliver_at_ms = deliver_at_ms
        self.expires_at_ms = expires_at_ms
        self.message_id = message_id
        self.correlation_id = correlation_id

    def message_ids(self) -> list[str | None]:
        """The ``message_id`` column, written out (None for each where none has one)."""
        return self._written_out(self.message_id)

    def correlation_ids(self) -> list[str | None]:
        """The ``correlation_id`` column, written out (None for each where none has one)."""
        return self._written_out(self.correlation_id)

    def _written_out(self, column: list[str | None] | None) -> list[str | None]:
        return [None] * len(self.ids) if column is None else column

    def __len__(self) -> int:
        return len(self.ids)

    def due_times(self) -> list[int]:
        return self.deliver_at_ms

    def _make(self) -> list[Message]:
        scheduled, no_queue = repeat(MessageState.SCHEDULED), repeat(None)
        return list(
            map(
                plain_message,
                self.ids,
                self.destination,
                self.body,
                self.sent_at_ms,
                self.deliver_at_ms,
                self.expires_at_ms,
                scheduled,
                no_queue,
                no_queue,
                no_queue,
                no_queue if self.message_id is None else self.message_id,
                no_queue if self.correlation_id is None else self.correlation_id,
            )
        )


class ReadyColumns(LazyMessages):
    """Rows ``rows`` of ``due`` released into ``queue`` at ``now_ms`` with their queue expiries:
    as messages, each as entering the queue leaves it (ready, in ``queue``, enqueued and
    updated at ``now_ms``)."""

    __slots__ = ("due", "now_ms", "queue", "queue_expires_at_ms", "rows")

    def __init__(
        self,
        due: DueColumns,
        rows: list[int],
        queue: str,
        now_ms: int,
        queue_expires_at_ms: list[int | None],
    ) -> None:
        super().__init__()
        self.due = due
        self.rows = rows
        self.queue = queue
        self.now_ms = now_ms
        self.queue_expires_at_ms = queue_expires_at_ms

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, values: list[_T]) -> list[_T]:
        """``values`` (a column of ``due``) at this release's rows, in order."""
        rows = self.rows
        if len(rows) == len(values):  # the whole batch went to this one queue
            return values
        return [values[row] for row in rows]

    def due_times(self) -> list[int]:
        return self.column(self.due.deliver_at_ms)

    def plain_lines(self) -> PlainLines | None:
        """Every message's journal line read from the columns, unless one expires (the rows
        of a release are all to its queue)."""
        due = self.due
        if not self.rows or any(e is not None for e in self.column(due.expires_at_ms)):
            return None
        return PlainLines(
            due.destination[self.rows[0]],
            self.column(due.ids),
            self.column(due.sent_at_ms),
            self.due_times(),
            [len(body) for body in self.column(due.body)],
            None if due.message_id is None else self.column(due.message_id),
            None if due.correlation_id is None else self.column(due.correlation_id),
        )

    def without(self, ids: set[str]) -> ReadyColumns:
        """The same release without the messages of ``ids``."""
        kept = [k for k, row in enumerate(self.rows) if self.due.ids[row] not in ids]
        return ReadyColumns(
            self.due,
            [self.rows[k] for k in kept],
            self.queue,
            self.now_ms,
            [self.queue_expires_at_ms[k] for k in kept],
        )

    def _make(self) -> list[Message]:
        due, queue, now, ready = self.due, self.queue, self.now_ms, MessageState.READY
        ids, destination, body = due.ids, due.destination, due.body
        sent, deliver, expires = due.sent_at_ms, due.deliver_at_ms, due.expires_at_ms
        message_id, correlation_id = due.message_ids(), due.correlation_ids()
        return [
            plain_message(
                ids[row],
                destination[row],
                body[row],
                sent[row],
                deliver[row],
                expires[row],
                ready,
                queue,
                now,
                queue_expires,
                message_id[row],
                correlation_id[row],
            )
            for row, queue_expires in zip(self.rows, self.queue_expires_at_ms, strict=True)
        ]
