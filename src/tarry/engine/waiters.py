"""Consumers waiting on a queue (long-poll ``receive``): counted, so a TTL-0 message can be handed
over instead of expiring, and woken when their queue gets messages; and how far behind the
consumers of each queue are (``lag``, ``tarry.queues.lag``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from tarry.queues.lag import DeliveryLag

__all__ = ["Waiters"]


class Waiters:
    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self._events: dict[str, asyncio.Event] = {}
        #: Per queue being consumed, its delivery lag (fed by ``receive`` and the sampler).
        self.lag = DeliveryLag()

    def event(self, queue: str) -> asyncio.Event:
        event = self._events.get(queue)
        if event is None:
            event = self._events[queue] = asyncio.Event()
        return event

    def wake(self, queues: set[str]) -> None:
        for queue in queues:
            event = self._events.pop(queue, None)
            if event is not None:
                event.set()

    def snapshot(self) -> dict[str, int]:
        return {q: n for q, n in self.count.items() if n}
