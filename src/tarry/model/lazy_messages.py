"""``LazyMessages``: a batch kept as columns, seen as a sequence of ``Message``s whose objects
are made in one pass the first time one is read (an event listener that reads messages one by
one); its length is known at once. ``AcceptedColumns.messages`` (sends) and
``tarry.model.due`` (releases) are its forms."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

from tarry.model.message import Message

__all__ = ["LazyMessages", "PlainLines"]


class PlainLines(NamedTuple):
    """What the journal's line of a plain message (no topic, message id, correlation id,
    expiry or failure) reads, for a batch of them all to one destination: per message its
    id, send and due times, and body size."""

    destination: str
    ids: Sequence[str]
    sent_at_ms: Sequence[int]
    deliver_at_ms: Sequence[int]
    sizes: Sequence[int]


class LazyMessages(Sequence[Message]):
    """Subclasses say how many (``__len__``) and how the objects are made (``_make``)."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: list[Message] | None = None

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _make(self) -> list[Message]:
        """Every message, in order (called once)."""

    def plain_lines(self) -> PlainLines | None:
        """The columns of every message's journal line, read without a ``Message``, when all
        are plain and to one destination; None (the journal reads the messages) otherwise or
        where a form does not say."""
        return None

    def due_times(self) -> Sequence[int]:
        """Every message's due time, in order (a form reads it from its columns)."""
        return [message.deliver_at_ms for message in self._all()]

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._all())

    def _all(self) -> list[Message]:
        if self._made is None:
            self._made = self._make()
        return self._made
