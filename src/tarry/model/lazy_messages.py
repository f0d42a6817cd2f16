"""``LazyMessages``: a batch kept as columns, seen as a sequence of ``Message``s whose objects
are made in one pass the first time one is read (an event listener that reads messages one by
one); its length is known at once. ``AcceptedColumns.messages`` (sends) and
``tarry.model.due`` (releases) are its forms."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import overload

from tarry.model.message import Message

__all__ = ["LazyMessages"]


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
