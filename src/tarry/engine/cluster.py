"""What a node must hear from, and guard against, the other nodes sharing its store.

With the embedded store one process owns everything, so none of this applies (every part here
is a no-op for a store that is no ``ClusterStore``, decided once when the engine is built).
With a shared PostgreSQL store:

- wake-ups: another node stored a message due earlier than this dispatcher planned to look
  (``tarry_due``); a queue received messages, so consumers waiting here look now
  (``tarry_filled``);
- the catalog (queues, topics, subscriptions, policies, routes) is reloaded whenever any node
  changes it (``tarry_catalog``, and after every reconnection, since changes may have been missed);
- arrival order in a queue is the arrival time (``ClockSequencer``), not a per-node count;
- the dispatcher fetches due messages and releases the local ones in one transaction
  (``_release_due``); where a claim must outlive a transaction (transports, or the two-step
  path), a release re-locks the claims this node still holds (``still_held``) so that a message
  whose lease lapsed while this node stalled is not released by two nodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

from tarry.config import StoreConfig
from tarry.dispatch.dispatcher import DueRelease, ReleaseDue
from tarry.engine.context import EngineContext
from tarry.engine.memory_queues import MemoryQueues
from tarry.engine.waiters import Waiters
from tarry.errors import DeliveryFailed, TarryError
from tarry.model.events import Event
from tarry.model.message import Message
from tarry.model.time import Clock
from tarry.queues.catalog import Catalog
from tarry.queues.sequence import ClockSequencer, Sequencer
from tarry.queues.txn import QueueTxn
from tarry.store.base import ClusterStore, DelayedStore, LeavingStore, QueueDatabase

__all__ = ["ClusterLink"]

log = logging.getLogger(__name__)


class ClusterLink:
    """The parts of an engine that differ where nodes share its store, chosen once from the
    store when the engine is built: the sequencer, the waiters, the local queues kept in memory
    (where they are this node's alone), the dispatcher's one-transaction
    release (``release_due``), what the store's notifications are wired to (``listen``), and
    what a release and a send tell the store (``still_held``, ``announce_due``)."""

    def __init__(self, store: DelayedStore, clock: Clock) -> None:
        self._store, self._clock = store, clock
        #: The store tells of other nodes' changes (PostgreSQL).
        self._cluster = store if isinstance(store, ClusterStore) else None
        #: The nodes share the queues too (``exactly_once``; with ``at_least_once`` each
        #: node's queues are its own).
        self._shared = self._cluster if store.shares_queue_database else None
        self.shares_queues = self._shared is not None
        self.sequencer = ClockSequencer(clock) if self.shares_queues else Sequencer()
        self.waiters = _ClusterWaiters(self._shared) if self._shared is not None else Waiters()

    def memory(
        self,
        queues: QueueDatabase,
        config: StoreConfig,
        catalog: Catalog,
        emit: Callable[[Sequence[Event]], None],
    ) -> MemoryQueues | None:
        """The local queues kept in memory in front of ``queues``, where the store can leave
        a released message unended (``LeavingStore``) and the configuration wants them; they
        are this node's alone, so never where nodes share the queues."""
        store = self._store
        if not config.queues_in_memory or not isinstance(store, LeavingStore):
            return None
        return MemoryQueues(queues, store, self._clock, catalog, self.sequencer, self.waiters, emit)

    def release_due(self, ctx: EngineContext) -> ReleaseDue | None:
        """The dispatcher's fetch-and-release in one transaction, where the queues are shared."""
        return partial(_release_due, ctx, self._shared) if self._shared is not None else None

    def listen(
        self,
        ctx: EngineContext,
        *,
        notify_due: Callable[[int], None],
        apply_routes: Callable[[Mapping[str, str]], None],
    ) -> None:
        """Wire the store's notifications: another node's due times to ``notify_due``, its
        fills to the consumers waiting here, its catalog changes to a reload."""
        if self._cluster is None:
            return
        self._cluster.on_due(notify_due)
        store = self._shared
        if store is None:
            return
        waiters = cast(_ClusterWaiters, self.waiters)
        store.on_filled(lambda queue: waiters.wake_here({queue}))
        reloader = _CatalogReloader(ctx, apply_routes)
        store.on_catalog_change(reloader.request)

    def announce_due(self, deliver_at_ms: int, now_ms: int) -> None:
        """After a send committed: wake the other nodes for a message due at ``deliver_at_ms``
        (in the background: the producer does not wait for it)."""
        # Where the queues are not shared, ``store.store`` announces by itself.
        if self._shared is not None:
            self._shared.announce_due(deliver_at_ms, now_ms=now_ms)

    def still_held(self, conn: Any, batch: Sequence[Message]) -> Sequence[Message]:
        """Inside the release transaction: the messages of ``batch`` this node still holds,
        their rows locked until commit (all of them for a store that only one process uses)."""
        if self._cluster is None:
            return batch
        held = self._cluster.release_claimed(conn, [m.id for m in batch])
        return [m for m in batch if m.id in held]


async def _release_due(
    ctx: EngineContext, store: ClusterStore, now_ms: int, limit: int, lease_ms: int
) -> DueRelease:
    """Fetch, enqueue and remove in ONE transaction (exactly_once): the due rows are locked
    (``SKIP LOCKED``: other nodes take the next ones), each local message goes through its
    queue's rules, and only what must outlive the transaction (refused messages, messages for
    transports) is claimed with a lease. A node killed inside it leaves nothing behind: its
    transaction rolls back and the messages are due again at once for every node."""

    def work(conn: Any) -> tuple[QueueTxn, DueRelease]:
        due = store.claim_due(conn, now_ms=now_ms, limit=limit)
        txn = ctx.txn(conn, now_ms)
        refused: list[tuple[Message, DeliveryFailed]] = []
        external: list[Message] = []
        for message in due:
            if message.destination in ctx.transports:
                external.append(message)
                continue
            try:
                txn.enqueue(message, message.destination)
            except DeliveryFailed as exc:
                refused.append((message, exc))
        held = [m.id for m in external] + [m.id for m, _ in refused]
        store.claim(conn, held, until_ms=now_ms + lease_ms)
        newest = max((m.deliver_at_ms for m in due if not m.failures), default=None)
        return txn, DueRelease(len(due) - len(held), refused, external, newest)

    txn, outcome = await ctx.qdb.write(work)
    ctx.after(txn)
    return outcome


class _ClusterWaiters(Waiters):
    """Waking the consumers of a queue wakes those waiting on the other nodes too: one NOTIFY
    per queue and flush, sent after the commit that filled it (coalesced while one is sent)."""

    def __init__(self, store: ClusterStore) -> None:
        super().__init__()
        self._store = store
        self._pending: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def wake(self, queues: set[str], *, in_memory: bool = False) -> None:
        super().wake(queues, in_memory=in_memory)
        if queues:
            self._pending |= queues
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._flush())

    def wake_here(self, queues: set[str]) -> None:
        super().wake(queues)

    async def _flush(self) -> None:
        while self._pending:
            queues, self._pending = sorted(self._pending), set()
            try:
                await self._store.announce_filled(queues)
            except TarryError as exc:  # consumers elsewhere look again within a second anyway
                log.warning("could not wake consumers on the other nodes: %s", exc)
                return


class _CatalogReloader:
    """Reload the catalog from the database, one reload at a time, coalescing requests."""

    def __init__(
        self, ctx: EngineContext, apply_routes: Callable[[Mapping[str, str]], None]
    ) -> None:
        self._ctx = ctx
        self._apply_routes = apply_routes
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self._reload()
            except TarryError as exc:
                log.warning("catalog reload failed (retrying on the next change): %s", exc)
            if not self._again:
                return

    async def _reload(self) -> None:
        ctx = self._ctx
        while True:
            fresh = Catalog()
            now = ctx.clock.now_ms()
            before = _fingerprint(ctx.catalog)
            await ctx.qdb.read(partial(fresh.load, now_ms=now))
            if _fingerprint(ctx.catalog) == before:
                break
            # This node changed its catalog while we read: what we read may predate it.
        for name, entry in fresh.queues.items():
            known = ctx.catalog.queues.get(name)
            if known is not None:  # last use is kept per node, in memory
                entry.last_used_ms = known.last_used_ms
        ctx.catalog.take(fresh)  # in place: the engine's parts hold it
        self._apply_routes(fresh.routes)


def _fingerprint(catalog: Catalog) -> tuple[object, ...]:
    return (
        sorted((n, repr(e.args)) for n, e in catalog.queues.items()),
        sorted((t, sorted(q)) for t, q in catalog.topics.items()),
        sorted((n, repr(p)) for n, p in catalog.policies.items()),
        sorted(catalog.routes.items()),
    )
