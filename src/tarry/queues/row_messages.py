"""A receive's or an ack's messages kept as the rows the queue database read or remembered,
``Message``s made only when one is read (an event listener that reads messages one by one, a
caller of ``receive`` outside the HTTP API): the HTTP answers are written from the rows
(``server/responses.py``), and a listener that only counts a run (the metrics) never makes
one. The database thread then does no more per message than its statements and memories need.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.sqlite.rows import from_row

__all__ = ["ReceivedRows", "RowMessages"]


class RowMessages(Sequence[Message]):
    """Rows (``SELECT_SQL``'s columns) as the messages ``from_row(row, delivered_at_ms=...)``
    makes of them, each then in ``state`` when given; the messages made in one pass the first
    time one is read (or ``made`` already, where the caller read them as messages)."""

    __slots__ = ("_delivered_at_ms", "_made", "_rows", "_state")

    def __init__(
        self,
        rows: Sequence[Sequence[Any]],
        delivered_at_ms: Sequence[int],
        state: MessageState | None = None,
        *,
        made: list[Message] | None = None,
    ) -> None:
        self._rows = rows
        self._delivered_at_ms = delivered_at_ms
        self._state = state
        self._made = made

    def __len__(self) -> int:
        return len(self._rows) if self._made is None else len(self._made)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self.made()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self.made())

    def made(self) -> list[Message]:
        """The messages, made now if not made yet."""
        if self._made is None:
            made = [
                from_row(row, delivered_at_ms=at)
                for row, at in zip(self._rows, self._delivered_at_ms, strict=True)
            ]
            state = self._state
            if state is not None:
                for message in made:
                    message.state = state
            self._made = made
        return self._made


class ReceivedRows(Sequence[tuple[Message, str]]):
    """What one receive at ``received_at_ms`` took, in queue order: each row (``SELECT_SQL``'s
    columns as they were before the receive) with its receipt, as (message, receipt) pairs for
    those that read them; the message of each as the receive left it (``messages``)."""

    __slots__ = ("messages", "receipts", "received_at_ms", "rows")

    def __init__(self, rows: list[Sequence[Any]], receipts: list[str], received_at_ms: int) -> None:
        self.rows = rows
        self.receipts = receipts
        self.received_at_ms = received_at_ms
        self.messages = RowMessages(rows, [received_at_ms] * len(rows))

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> tuple[Message, str]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[Message, str]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[Message, str] | Sequence[tuple[Message, str]]:
        return list(zip(self.messages, self.receipts, strict=True))[index]

    def __iter__(self) -> Iterator[tuple[Message, str]]:
        return zip(self.messages, self.receipts, strict=True)
