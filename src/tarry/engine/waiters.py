"""Consumers waiting on a queue (long-poll ``receive``): counted, so a TTL-0 message can be handed
over instead of expiring, and woken when their queue gets messages; which queues may hold ready
messages (so a receive takes without looking first); and how far behind the consumers of each
queue are (``lag``, ``tarry.queues.lag``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from tarry.queues.lag import DeliveryLag

__all__ = ["Waiters"]


class Waiters:
    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self._events: dict[str, asyncio.Event] = {}
        #: Queues filled since a receive last emptied them.
        self._filled: set[str] = set()
        #: Per queue being consumed, its delivery lag (fed by ``receive`` and the sampler).
        self.lag = DeliveryLag()

    def event(self, queue: str) -> asyncio.Event:
        event = self._events.get(queue)
        if event is None:
            event = self._events[queue] = asyncio.Event()
        return event

    def wake(self, queues: set[str]) -> None:
        self._filled |= queues
        for queue in queues:
            event = self._events.pop(queue, None)
            if event is not None:
                event.set()

    def may_hold(self, queue: str) -> bool:
        """Whether ``queue`` was filled since a receive last emptied it (it may still hold
        ready messages): a receive then takes without looking first."""
        return queue in self._filled

    def took(self, queue: str, *, emptied: bool) -> None:
        """A receive took from ``queue``: everything takeable (``emptied``), or it left more."""
        if emptied:
            self._filled.discard(queue)
        else:
            self._filled.add(queue)

    def snapshot(self) -> dict[str, int]:
        return {q: n for q, n in self.count.items() if n}
