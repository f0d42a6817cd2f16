"""``LazyMessages``: a batch kept as columns, seen as a sequence of ``Message``s whose objects
are made in one pass the first time one is read (an event listener that reads messages one by
one); its length is known at once. ``AcceptedColumns.messages`` (sends), ``tarry.model.due``
(releases) and ``tarry.queues.row_messages`` (receives, acks) are its forms; ``LazySequence``
is the same for objects of any kind (a receive's deliveries)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Generic, NamedTuple, TypeVar, overload

from tarry.model.message import Message

__all__ = ["LazyMessages", "LazySequence", "PlainLines"]

_T = TypeVar("_T")


class PlainLines(NamedTuple):
    """What the journal's line of a plain message (no topic, expiry or failure) reads, for a
    batch of them all to one destination: per message its id, send and due times, body size,
    and its producer's ids (each None for a batch where none has one)."""

    destination: str
    ids: Sequence[str]
    sent_at_ms: Sequence[int]
    deliver_at_ms: Sequence[int]
    sizes: Sequence[int]
    message_ids: Sequence[str | None] | None = None
    correlation_ids: Sequence[str | None] | None = None


class LazySequence(Sequence[_T], Generic[_T]):
    """Subclasses say how many (``__len__``) and how the objects are made (``_make``)."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: list[_T] | None = None

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _make(self) -> list[_T]:
        """Every object, in order (called once)."""

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...

    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        return self._all()[index]

    def __iter__(self) -> Iterator[_T]:
        return iter(self._all())

    def _all(self) -> list[_T]:
        if self._made is None:
            self._made = self._make()
        return self._made


class LazyMessages(LazySequence[Message]):
    """A ``LazySequence`` of messages; a form that can tells their due times and journal lines
    from its columns."""

    __slots__ = ()

    def plain_lines(self) -> PlainLines | None:
        """The columns of every message's journal line, read without a ``Message``, when all
        are plain and to one destination; None (the journal reads the messages) otherwise or
        where a form does not say."""
        return None

    def due_times(self) -> Sequence[int]:
        """Every message's due time, in order (a form reads it from its columns)."""
        return [message.deliver_at_ms for message in self._all()]
