"""Due messages as columns, for the common release: plain messages (every optional field at its
default, never failed) that a store read back when they fell due. The dispatcher routes them,
the queue database writes them and the events tell them from the columns; ``DueColumns`` is
still a sequence of ``Message``s for whoever reads one (a refused message, an external route),
and ``ReadyColumns`` the released ones for a listener that reads messages, each made only when
first read, as ``AcceptedColumns.messages`` does for sends.

What does not fit (headers, a producer id, a failure counted, ...) comes back as ``Message``s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from tarry.model.message import NO_REPORT, Message, Undeliverable, plain_message
from tarry.model.state import MessageState

__all__ = ["DueColumns", "ReadyColumns"]


class DueColumns(Sequence[Message]):
    """Plain scheduled messages, row ``k`` of each column being message ``k``; as messages,
    each is ``plain_message`` of its row (made once, when first read)."""

    __slots__ = (
        "_made",
        "body",
        "deliver_at_ms",
        "destination",
        "expires_at_ms",
        "ids",
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
    ) -> None:
        self.ids = ids
        self.destination = destination
        self.body = body
        self.sent_at_ms = sent_at_ms
        self.deliver_at_ms = deliver_at_ms
        self.expires_at_ms = expires_at_ms
        self._made: list[Message] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._all())

    def message(self, row: int) -> Message:
        """Row ``row`` as a new ``Message`` (the others are not made)."""
        return plain_message(
            self.ids[row],
            self.destination[row],
            self.body[row],
            self.sent_at_ms[row],
            self.deliver_at_ms[row],
            self.expires_at_ms[row],
        )

    def _all(self) -> list[Message]:
        if self._made is None:
            self._made = list(
                map(
                    plain_message,
                    self.ids,
                    self.destination,
                    self.body,
                    self.sent_at_ms,
                    self.deliver_at_ms,
                    self.expires_at_ms,
                )
            )
        return self._made


class ReadyColumns(Sequence[Message]):
    """Rows ``rows`` of ``due`` released into ``queue`` at ``now_ms`` with their queue expiries:
    as messages, each as entering the queue leaves it (ready, in ``queue``, enqueued and
    updated at ``now_ms``), made once, when first read."""

    __slots__ = ("_made", "due", "now_ms", "queue", "queue_expires_at_ms", "rows")

    def __init__(
        self,
        due: DueColumns,
        rows: list[int],
        queue: str,
        now_ms: int,
        queue_expires_at_ms: list[int | None],
    ) -> None:
        self.due = due
        self.rows = rows
        self.queue = queue
        self.now_ms = now_ms
        self.queue_expires_at_ms = queue_expires_at_ms
        self._made: list[Message] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._all())

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

    def _all(self) -> list[Message]:
        if self._made is None:
            due, rows, queue, now = self.due, self.rows, self.queue, self.now_ms
            ids, destination, body = due.ids, due.destination, due.body
            sent, deliver, expires = due.sent_at_ms, due.deliver_at_ms, due.expires_at_ms
            self._made = [
                _ready_message(
                    ids[row],
                    destination[row],
                    body[row],
                    sent[row],
                    deliver[row],
                    expires[row],
                    queue,
                    now,
                    queue_expires,
                )
                for row, queue_expires in zip(rows, self.queue_expires_at_ms, strict=True)
            ]
        return self._made


def _ready_message(
    id: str,
    destination: str,
    body: bytes,
    sent_at_ms: int,
    deliver_at_ms: int,
    expires_at_ms: int | None,
    queue: str,
    now_ms: int,
    queue_expires_at_ms: int | None,
) -> Message:
    """``plain_message`` of a row as entering ``queue`` at ``now_ms`` leaves it (``QueueTxn``'s
    ``_ready``), every field passed by position as ``plain_message`` does (keep the order of
    ``Message``'s fields)."""
    return Message(
        id,
        destination,
        body,
        {},  # headers
        sent_at_ms,
        deliver_at_ms,
        expires_at_ms,
        MessageState.READY,
        None,  # message_id
        None,  # correlation_id
        None,  # reply_to
        NO_REPORT,
        Undeliverable.DEAD_LETTER,
        True,  # persistent
        None,  # topic
        0,  # failures
        None,  # last_error
        [],  # deaths
        queue,
        now_ms,  # enqueued_at_ms
        queue_expires_at_ms,
        False,  # redelivered
        0,  # delivery_count
        now_ms,  # updated_at_ms
    )
