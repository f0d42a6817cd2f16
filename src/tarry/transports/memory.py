"""``MemoryTransport``: a recording transport for unit tests, with ``fail_next`` failure
injection. An honest implementation, not a mock: it accepts or fails like a real destination."""

from __future__ import annotations

from tarry.errors import DeliveryFailed
from tarry.model.message import Message

__all__ = ["MemoryTransport"]


class MemoryTransport:
    def __init__(self) -> None:
        self.delivered: list[Message] = []
        self._failures: list[DeliveryFailed] = []

    def fail_next(self, count: int, error: DeliveryFailed | None = None) -> None:
        """The next ``count`` deliveries raise ``error`` (default: a transient failure)."""
        failure = error or DeliveryFailed("injected failure", reason="injected", permanent=False)
        self._failures.extend([failure] * count)

    async def deliver(self, message: Message) -> None:
        if self._failures:
            raise self._failures.pop(0)
        self.delivered.append(message)

    async def close(self) -> None:
        return None
