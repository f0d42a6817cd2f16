"""The transport seam: how a due message leaves tarry for a destination outside it.

A transport either accepts a message (returns) or raises ``DeliveryFailed`` with a reason; it
translates its library's exceptions (httpx, aio-pika) into ``DeliveryFailed`` in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tarry.errors import DeliveryFailed
from tarry.model.message import Message

__all__ = ["BatchTransport", "DeliveryFailed", "Transport"]


class Transport(Protocol):
    """Delivers messages to one kind of external destination."""

    async def deliver(self, message: Message) -> None:
        """Hand ``message`` to the destination; return only once it accepted it.

        Raises ``DeliveryFailed`` (``permanent=True`` in ``details`` when retrying cannot help)."""
        ...

    async def close(self) -> None:
        """Release connections; called once at shutdown."""
        ...


class BatchTransport(Transport, Protocol):
    """A transport that can hand over many messages at once (pipelined publishes); the
    dispatcher uses ``deliver_batch`` when a transport has it."""

    async def deliver_batch(self, messages: Sequence[Message]) -> list[DeliveryFailed | None]:
        """Deliver each message; one outcome per message, in order: ``None`` when the
        destination accepted it, else its ``DeliveryFailed``. Never raises for one message."""
        ...
