"""The accepted sends of one request as columns, for the common case: plain sends (destination,
body, a delay or a time, a TTL, a ``message_id``, a ``correlation_id``) to local queues, each
its own message. The
engine stores them through a store that takes columns (``tarry.store.base.ColumnStore``) and
answers them from the same columns, with no request, plan or message object per send;
``messages`` gives the object form to those that read messages one by one (event listeners),
built once, when first read.

What does not fit (a topic, a route, headers, a send due at once, ...) takes the general path
(``tarry.engine.sending``), which makes one ``Message`` per copy; so does a batch in which a
``message_id`` repeats one kept already (its answer names the message kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import numpy.typing as npt

from tarry.model.lazy_messages import LazyMessages
from tarry.model.message import Message, plain_message
from tarry.model.state import MessageState

__all__ = ["AcceptedColumns", "ColumnMessages"]

I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class AcceptedColumns:
    """Plain accepted sends, row ``k`` being the send at ``rows[k]`` of its request; every
    message sent at ``sent_at_ms`` and kept as scheduled, with every field not here at its
    default (``plain_message``)."""

    rows: list[int]
    #: Tarry ids (``IdGenerator.new_due_many``), 26 ASCII characters each.
    ids: list[str]
    destination: list[str]
    body: list[bytes]
    sent_at_ms: int
    deliver_at_ms: I64
    #: -1: never expires.
    expires_at_ms: I64
    #: Each send's ``message_id`` (an idempotent producer's); None when no send has one.
    message_id: list[str | None] | None = None
    #: Each send's ``correlation_id``; None when no send has one.
    correlation_id: list[str | None] | None = None
    _messages: ColumnMessages | None = field(default=None, init=False)

    def __len__(self) -> int:
        return len(self.rows)

    def messages(self) -> ColumnMessages:
        """The rows as ``Message``s (made once, when first read)."""
        if self._messages is None:
            self._messages = ColumnMessages(self)
        return self._messages


class ColumnMessages(LazyMessages):
    """``AcceptedColumns`` as a sequence of ``Message``s (``LazyMessages``)."""

    __slots__ = ("_columns",)

    def __init__(self, columns: AcceptedColumns) -> None:
        super().__init__()
        self._columns = columns

    def __len__(self) -> int:
        return len(self._columns.rows)

    @property
    def columns(self) -> AcceptedColumns:
        """The columns the messages stand for (a listener may read them instead)."""
        return self._columns

    def _make(self) -> list[Message]:
        c = self._columns
        sent = c.sent_at_ms
        expires: list[int | None] = [None if e < 0 else e for e in c.expires_at_ms.tolist()]
        return list(
            map(
                plain_message,
                c.ids,
                c.destination,
                c.body,
                repeat(sent),
                c.deliver_at_ms.tolist(),
                expires,
                repeat(MessageState.SCHEDULED),
                repeat(None),
                repeat(None),
                repeat(None),
                repeat(None) if c.message_id is None else c.message_id,
                repeat(None) if c.correlation_id is None else c.correlation_id,
            )
        )
