"""Consumers waiting on a queue (long-poll ``receive``): counted, so a TTL-0 message can be handed
over instead of expiring, and woken when their queue gets messages; which queues may hold ready
messages (so a receive takes without looking first), and which hold nothing takeable in the
queue database for a while (so a receive takes from the queues kept in memory without looking
there, ``tarry.engine.memory_queues``); and how far behind the consumers of each queue are
(``lag``, ``tarry.queues.lag``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from tarry.queues.lag import DeliveryLag

__all__ = ["RELOOK_MS", "Waiters"]

#: How long a look that found nothing takeable in the queue database counts: rows in flight
#: there become takeable again when their visibility timeout ends, which wakes nobody.
RELOOK_MS = 1_000


class Waiters:
    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self._events: dict[str, asyncio.Event] = {}
        #: Queues filled since a receive last emptied them.
        self._filled: set[str] = set()
        #: Queues whose rows in the queue database none is takeable before the time given.
        self._clear_until: dict[str, int] = {}
        #: Per queue being consumed, its delivery lag (fed by ``receive`` and the sampler).
        self.lag = DeliveryLag()

    def event(self, queue: str) -> asyncio.Event:
        event = self._events.get(queue)
        if event is None:
            event = self._events[queue] = asyncio.Event()
        return event

    def wake(self, queues: set[str], *, in_memory: bool = False) -> None:
        """Consumers of ``queues`` woken: the queue database was filled (or, ``in_memory``,
        only the queues kept in memory)."""
        if not in_memory:
            self._filled |= queues
            for queue in queues:
                self._clear_until.pop(queue, None)
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

    def nothing_takeable(self, queue: str, *, now_ms: int) -> bool:
        """Whether the queue database is known to hold nothing takeable of ``queue`` now."""
        return self._clear_until.get(queue, 0) > now_ms

    def found_nothing(self, queue: str, *, now_ms: int) -> None:
        """A look or a receive found nothing (more) takeable of ``queue`` in the queue
        database: it counts for ``RELOOK_MS``, or until it is filled."""
        self._filled.discard(queue)
        self._clear_until[queue] = now_ms + RELOOK_MS

    def takeable_from(self, queue: str, at_ms: int) -> None:
        """Rows of ``queue`` in the queue database become takeable at ``at_ms`` (written in
        flight, their visibility timeout ending then)."""
        until = self._clear_until.get(queue)
        if until is not None and at_ms < until:
            self._clear_until[queue] = at_ms

    def forget_looks(self) -> None:
        """Some write may have changed any queue: no look counts any more."""
        self._clear_until.clear()

    def snapshot(self) -> dict[str, int]:
        return {q: n for q, n in self.count.items() if n}
