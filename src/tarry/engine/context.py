"""``EngineContext``: what the engine's parts (queue and catalog administration, housekeeping,
operations) need of the engine, and no more: the stores, the catalog, the clock, a queue
transaction, what runs after its commit, how events are told and how the dispatcher hears of a
due time. Built before the dispatcher and the release path (which take it), from the cluster
link's parts, so a part never reaches into the ``Engine`` itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tarry.config import TarryConfig
from tarry.engine.memory_queues import MemoryQueues
from tarry.engine.waiters import Waiters
from tarry.model.events import Event
from tarry.model.route_policy import RoutePolicy
from tarry.model.time import Clock
from tarry.queues import counts
from tarry.queues.catalog import Catalog
from tarry.queues.txn import QueueTxn
from tarry.store.base import DelayedStore, QueueDatabase
from tarry.store.sql import QueueConnection
from tarry.transports.base import Transport

T = TypeVar("T")

__all__ = ["EngineContext", "MakeTxn"]


class MakeTxn(Protocol):
    """A queue transaction on ``conn`` at ``now_ms``; ``error_queue``: where it dead-letters
    delivery failures (default: ``[dispatch] error_queue``)."""

    def __call__(
        self, conn: QueueConnection, now_ms: int, error_queue: str | None = None, /
    ) -> QueueTxn: ...


@dataclass(frozen=True, slots=True)
class EngineContext:
    config: TarryConfig
    store: DelayedStore
    #: The queue database (the store itself where it shares one).
    qdb: QueueDatabase
    #: True: the store shares the queue database (SQLite, PostgreSQL).
    shared: bool
    clock: Clock
    catalog: Catalog
    transports: Mapping[str, Transport]
    waiters: Waiters
    #: A queue transaction on ``conn`` at ``now_ms``.
    txn: MakeTxn
    #: After a transaction committed: tell its events, wake the consumers of what it filled.
    after: Callable[[QueueTxn], None]
    #: Tell the listeners about changes already made.
    emit: Callable[[Sequence[Event]], None]
    #: A message falls due at ``deliver_at_ms`` (committed at ``now_ms``): wake the dispatcher
    #: here, and on the other nodes where they share the store.
    due: Callable[[int, int], None]
    #: The delivery policy of a route (None: not a route).
    policy_for: Callable[[str], RoutePolicy | None]

    @property
    def memory(self) -> MemoryQueues | None:
        """The local queues kept in memory (``qdb`` itself then), None where they are not."""
        return self.qdb if isinstance(self.qdb, MemoryQueues) else None

    @property
    def queue_db(self) -> QueueDatabase:
        """The queue database without the write-out the memory's barrier makes first: for a
        release, a receive or an ack, and for reads that rows in memory cannot change."""
        return self.qdb.database if isinstance(self.qdb, MemoryQueues) else self.qdb

    async def read_beside(
        self, queue: str, work: Callable[[QueueConnection], T]
    ) -> tuple[T, int, int]:
        """``work``'s answer from the queue database with ``queue``'s ready and in-flight rows
        held in memory beside it (0, 0 where none are), nothing written out: a count operators
        poll (``MemoryQueues.read_beside``)."""
        memory = self.memory
        if memory is None:
            return await self.qdb.read(work), 0, 0
        return await memory.read_beside(queue, work)

    async def counts_by_state(self) -> dict[str, int]:
        """Messages per state in the local queues, those held in memory counted where they are,
        nothing written out (``/metrics`` reads this at every scrape)."""
        memory = self.memory
        if memory is None:
            return await self.qdb.read(counts.by_state)
        return await memory.counts_by_state()

    def failure_queue(self, destination: str) -> str:
        """Where a message for ``destination`` goes when it cannot be delivered: the route's
        ``dead_letter_to``, or the local queue's own ``dead_letter_to`` in force, so a tenant
        reads its own failures; else (or when that names no declared queue, so a failure is
        never dropped) the shared ``[dispatch] error_queue``."""
        policy = self.policy_for(destination)
        target = policy.dead_letter_to if policy is not None else None
        entry = self.catalog.queues.get(destination)
        if target is None and entry is not None:
            target = entry.effective.dead_letter_to
        if target is not None and target in self.catalog.queues:
            return target
        return self.config.dispatch.error_queue
