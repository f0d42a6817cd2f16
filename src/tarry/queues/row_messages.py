"""A receive's or an ack's messages kept as the rows the queue database read or remembered,
``Message``s made only when one is read (an event listener that reads messages one by one, a
caller of ``receive`` outside the HTTP API): the HTTP answers are written from the rows
(``server/responses.py``), and a listener that only counts a run (the metrics) never makes
one. The database thread then does no more per message than its statements and memories need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tarry.model.lazy_messages import LazyMessages, LazySequence, PlainLines
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.sqlite.rows import COLUMNS, from_row

__all__ = ["ReceivedRows", "RowMessages"]

_ID, _DESTINATION, _BODY = (COLUMNS.index(c) for c in ("id", "destination", "body"))
_SENT_AT, _DELIVER_AT = (COLUMNS.index(c) for c in ("sent_at_ms", "deliver_at_ms"))
_FAILURES, _MESSAGE_ID = COLUMNS.index("failures"), COLUMNS.index("message_id")
_CORRELATION_ID = COLUMNS.index("correlation_id")
#: The columns a plain message leaves empty, of those its journal line reads.
_NONE_WHEN_PLAIN = tuple(COLUMNS.index(c) for c in ("topic", "expires_at_ms"))


class RowMessages(LazyMessages):
    """Rows (``SELECT_SQL``'s columns) as the messages ``from_row(row, delivered_at_ms=...)``
    makes of them, each then in ``state`` when given; the messages made in one pass the first
    time one is read (``LazyMessages``)."""

    __slots__ = ("_delivered_at_ms", "_rows", "_state")

    def __init__(
        self,
        rows: Sequence[Sequence[Any]],
        delivered_at_ms: Sequence[int],
        state: MessageState | None = None,
    ) -> None:
        super().__init__()
        self._rows = rows
        self._delivered_at_ms = delivered_at_ms
        self._state = state

    def __len__(self) -> int:
        return len(self._rows)

    def _make(self) -> list[Message]:
        made = [
            from_row(row, delivered_at_ms=at)
            for row, at in zip(self._rows, self._delivered_at_ms, strict=True)
        ]
        state = self._state
        if state is not None:
            for message in made:
                message.state = state
        return made

    def due_times(self) -> list[int]:
        return [row[_DELIVER_AT] for row in self._rows]

    def plain_lines(self) -> PlainLines | None:
        """Every message's journal line read from the rows (``from_row`` keeps these columns
        as they are, a missing body as empty) when each is plain (its producer's ids it may
        have) and all are to one destination."""
        rows = self._rows
        if not rows:
            return None
        # A column at a time (each a tuple), each test one C-level count.
        columns = list(zip(*rows, strict=False))
        n, first = len(rows), rows[0][_DESTINATION]
        if (
            columns[_DESTINATION].count(first) != n
            or columns[_FAILURES].count(0) != n
            or any(columns[c].count(None) != n for c in _NONE_WHEN_PLAIN)
        ):
            return None
        bodies, message_ids, correlation_ids = (
            columns[_BODY],
            columns[_MESSAGE_ID],
            columns[_CORRELATION_ID],
        )
        return PlainLines(
            first,
            columns[_ID],
            columns[_SENT_AT],
            columns[_DELIVER_AT],
            [len(body or b"") for body in bodies] if None in bodies else list(map(len, bodies)),
            None if message_ids.count(None) == n else message_ids,
            None if correlation_ids.count(None) == n else correlation_ids,
        )


class ReceivedRows(LazySequence[tuple[Message, str]]):
    """What one receive at ``received_at_ms`` took, in queue order: each row (``SELECT_SQL``'s
    columns as they were before the receive) with its receipt, as (message, receipt) pairs for
    those that read them; the message of each as the receive left it (``messages``). ``more``:
    whether the queue may hold more it could take (``queues.ready_rows.takeable_rows``)."""

    __slots__ = ("messages", "more", "receipts", "received_at_ms", "rows")

    def __init__(self, rows: list[Sequence[Any]], receipts: list[str], received_at_ms: int) -> None:
        super().__init__()
        self.rows = rows
        self.receipts = receipts
        self.received_at_ms = received_at_ms
        self.messages = RowMessages(rows, [received_at_ms] * len(rows))
        self.more = True

    def __len__(self) -> int:
        return len(self.rows)

    def _make(self) -> list[tuple[Message, str]]:
        return list(zip(self.messages, self.receipts, strict=True))
