"""The delayed-message store contract, shaped after NServiceBus's ``IDelayedMessageStore``
(store / fetch-next-due / next-due-time / remove / count-failure), made batch-shaped so that
throughput does not die on per-message round trips.

Guarantees every implementation gives (``tests/contract/test_store_contract.py`` checks them):

- ``store`` returns only once the messages are durable (per the store's durability setting);
  a message whose (destination, ``message_id``) is already kept is not stored again, and the
  kept one is returned with ``created=False``.
- ``fetch_due`` returns messages due at or before ``now_ms`` (never one due later), oldest due
  first, and claims them: until the claim is released (``remove``, ``record_failure``, or the
  lease ending) no other ``fetch_due`` returns them. A claim does not survive the process
  (where several processes share the store, PostgreSQL, it lapses with its lease instead).
- ``remove`` finishes claimed messages; ``cancel``/``reschedule`` refuse claimed ones.
- Every method raises ``Unavailable`` when the store cannot do it now, and nothing is changed.

The store and the local queues (the "queue database")
-----------------------------------------------------
Local queues (catalog, ready and in-flight messages, finished-message records kept for ``GET``
and de-duplication during ``retention_ms``) live in a ``QueueDatabase``: a SQLite database today
(``SQLiteStore`` is one), driven by ``tarry.queues.txn.QueueTxn`` inside ``write`` transactions.
How a due message enters its local queue exactly once across crashes depends on whether the
delayed store shares that database (``shares_queue_database``):

- **shared** (``SQLiteStore``; the PostgreSQL store too): the scheduled message is already a row of
  the queue database; release is one transaction that moves the row into its queue, so it
  happens once or not at all. Such a store is a ``SharedDelayedStore``: it keeps (``store_in``)
  and gives up (``lock_for_give_up``) messages inside the engine's queue transaction
  (``tarry.engine.shared_release``, ``tarry.engine.sending``).
- **separate** (``LogStore``, ``MemoryStore``): release (``tarry.engine.release``) first inserts the
  message into its queue keyed by its tarry id (a key in release order: ``key`` in
  ``tarry.store.sqlite.schema``), in one queue-database transaction
  (``QueueTxn.enqueue(insert=True)``: the queue row *is* the marker "where the released message
  now lives"; a second release of the same id finds the row and does nothing), then calls
  ``remove(ids, state=READY)`` so the store appends its release marker and can clean up. A crash
  in between leaves a message the store still holds as scheduled; it is fetched again and its
  release is a no-op, so the engine treats "id present in the queue database" as released (``get``,
  ``cancel``, ``reschedule`` and listing look there first). De-duplication by
  (destination, ``message_id``) consults the queue database for released messages and the store
  for pending ones; the store keeps a key until the message is released *and* its marker made
  durable.
- External destinations (HTTP, RabbitMQ routes) are at-least-once for every store: the message is
  removed only after the transport accepted it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from tarry.model.accepted import AcceptedColumns
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState
from tarry.store.sql import QueueConnection

T = TypeVar("T")

__all__ = [
    "ClusterStore",
    "ColumnStore",
    "DelayedStore",
    "LeavingStore",
    "QueueDatabase",
    "SharedDelayedStore",
    "StoreOutcome",
]


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, a
# noticeable share of what storing a message costs in the log store (one outcome per message).
@dataclass(slots=True)
class StoreOutcome:
    """What ``DelayedStore.store`` did with one message (read-only by convention)."""

    message: Message
    #: False when an earlier message with the same (destination, message_id) was returned.
    created: bool


class DelayedStore(Protocol):
    #: True when scheduled messages live in the queue database itself (see the module docstring).
    shares_queue_database: bool

    async def open(self) -> None:
        """Open (and recover) the store. Raises ``Unavailable``."""
        ...

    def release_claims(self, ids: Sequence[str]) -> None:
        """Drop the claims on ``ids`` (a failed release is retried on the next round)."""
        ...

    def hold_claims(self, ids: Sequence[str], *, until_ms: int) -> None:
        """Keep claimed ``ids`` back until ``until_ms`` without counting a failure (their
        destination is away); they fall due again then."""
        ...

    async def store(self, messages: Sequence[Message]) -> list[StoreOutcome]:
        """Durably keep ``messages`` (state ``scheduled``) in one commit. Raises ``Unavailable``."""
        ...

    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> Sequence[Message]:
        """Claim up to ``limit`` messages with ``deliver_at_ms <= now_ms``, oldest due first
        (a store may give plain ones as ``tarry.model.due.DueColumns``)."""
        ...

    async def next_due_time(self) -> int | None:
        """When the earliest unclaimed scheduled message falls due (None when there is none)."""
        ...

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        """Finish claimed messages with ``state`` (delivered, expired, dead_lettered, or ``ready``:
        released into a local queue of a separate queue database); returns how many were still
        there (fewer means another path already finished them)."""
        ...

    async def record_failure(self, message_id: str, *, error: str, retry_at_ms: int) -> int:
        """Count a failed delivery, release the claim, and keep the message back until
        ``retry_at_ms``; returns the new failure count (0 when the message is gone)."""
        ...

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        """Cancel a scheduled message. Raises ``not_found``, ``not_cancellable``."""
        ...

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        """Move a scheduled message's due time. Raises ``not_found``, ``not_cancellable``."""
        ...

    async def get(self, message_id: str) -> Message | None: ...

    async def list(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        """Messages matching ``query`` ordered by (deliver_at, id), and the next page's cursor.
        A page may end early, with fewer items than asked for and a cursor naming the due time
        it read up to (``tarry.store.sqlite.store.early_cursor``): the log store does, rather
        than read every partition for a filter that matches rarely."""
        ...

    async def count_scheduled(self, destination: str | None = None) -> int:
        """Scheduled messages, all or for one destination."""
        ...

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> builtins.list[int]:
        """Scheduled messages due in each of ``buckets`` windows ``[start_ms + i * width_ms,
        start_ms + (i + 1) * width_ms)`` (the console's forecast), read from the store's due
        index, never by reading messages. Exact, except in the log store, which counts by time
        partition: a window narrower than its partitions gets their share in proportion to the
        overlap, unless the partition's due index is loaded (then it is exact); the windows'
        sum is exact wherever they cover whole partitions."""
        ...

    async def check(self) -> builtins.list[str]:
        """Integrity problems found (empty when sound); every store test ends with it."""
        ...

    async def probe(self) -> None:
        """The store breaker's trial while it is open: a small write no reader sees, to tell
        whether the fault cleared. Raises ``Unavailable`` (``StorageFault`` for the disk)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class LeavingStore(Protocol):
    """A store that can keep a released message out of circulation without ending it, so
    that local queues may hold it in memory (``tarry.queues.memory``): a crash before its end
    is written finds it due again."""

    def may_leave(self, ids: Sequence[str]) -> bool:
        """Whether ``leave`` would take every message of ``ids`` (each claimed), and the
        store can vouch that none was released before (none of its markers failed)."""
        ...

    def leave(self, ids: Sequence[str]) -> None:
        """Take the claimed messages of ``ids`` out of circulation, with nothing written."""
        ...

    async def finish_left(
        self, ids: Sequence[str], *, state: MessageState, now_ms: int, durable: bool
    ) -> int:
        """End messages ``leave`` took out, in ``state``; returns once that is written (and
        fsynced, when ``durable``, as the store's policy fsyncs). Raises ``Unavailable``, the
        messages then due again at once."""
        ...


class SharedDelayedStore(DelayedStore, Protocol):
    """A store whose scheduled messages are rows of the queue database (``shares_queue_database``
    is True): the engine keeps and gives them up inside its own queue transaction
    (``QueueDatabase.write``), so that what the transaction also does to the queues commits, or
    rolls back, with them."""

    def store_in(
        self, conn: QueueConnection, messages: Sequence[Message]
    ) -> builtins.list[StoreOutcome]:
        """``store``, inside the caller's transaction on ``conn``: kept once it commits (durable
        as its commit is), not at all when it rolls back; the same de-duplication."""
        ...

    def lock_for_give_up(self, conn: QueueConnection, message_id: str, *, failures: int) -> bool:
        """Inside the caller's transaction on ``conn``: lock the message's row while it is still
        scheduled and set its failure count, so the transaction can dead-letter it; False (and
        nothing changed) when it was cancelled or finished meanwhile."""
        ...


@runtime_checkable
class ColumnStore(Protocol):
    """A store that keeps a batch of plain messages given as columns (``AcceptedColumns``),
    without a ``Message`` per row: the send path's common case (``tarry.engine.sending``).
    The engine checks for it once, when it is built; a store without it is given the same
    messages as objects (``AcceptedColumns.messages``) through ``store``."""

    async def store_columns(self, batch: AcceptedColumns) -> bool:
        """``store(batch.messages())``: durably keep them, in one commit, all created. False,
        with nothing kept, when a ``message_id`` of the batch names a message the store holds
        or is writing: ``store`` of the messages then answers which are repeats. Raises
        ``Unavailable``."""
        ...


@runtime_checkable
class ClusterStore(Protocol):
    """A store several nodes share (PostgreSQL): it tells each node of the others' changes, and
    claims due messages per node inside the engine's queue transaction. The engine checks for
    it once, when it is built (``tarry.engine.cluster.ClusterLink``)."""

    def on_due(self, handler: Callable[[int], None]) -> None:
        """``handler(deliver_at_ms)`` when another node stored a message due then."""
        ...

    def on_filled(self, handler: Callable[[str], None]) -> None:
        """``handler(queue)`` when another node filled ``queue`` (shared queues only)."""
        ...

    def on_catalog_change(self, handler: Callable[[], None]) -> None:
        """``handler()`` when another node changed the catalog, or changes may have been missed."""
        ...

    def announce_due(self, deliver_at_ms: int, *, now_ms: int) -> None:
        """Wake the other nodes for a committed message due at ``deliver_at_ms`` (in the
        background: the caller does not wait)."""
        ...

    async def announce_filled(self, queues: Sequence[str]) -> None:
        """Tell the other nodes' waiting consumers that ``queues`` received messages."""
        ...

    def claim_due(
        self, conn: QueueConnection, *, now_ms: int, limit: int
    ) -> builtins.list[Message]:
        """Inside a transaction: the next due messages no other node holds, oldest due first,
        their rows locked until commit."""
        ...

    def claim(self, conn: QueueConnection, ids: Sequence[str], *, until_ms: int) -> None:
        """Inside the transaction of ``claim_due``: keep ``ids`` claimed by this node after the
        commit, until ``until_ms``."""
        ...

    def release_claimed(self, conn: QueueConnection, ids: Sequence[str]) -> set[str]:
        """Inside a release transaction: lock the rows of ``ids`` this node still holds and
        return their ids (a row another node took after this node's lease lapsed is left out)."""
        ...


class QueueDatabase(Protocol):
    """Where the local queues live (see the module docstring). ``write`` runs ``work`` inside a
    transaction shared with concurrent writes (group commit) and returns once it is committed,
    fsynced when ``durable``; ``read`` runs outside any write transaction."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def write(
        self,
        work: Callable[[QueueConnection], T],
        *,
        durable: bool = False,
        first: bool = False,
        claims_aware: bool = False,
    ) -> T:
        """``first``: a release, which goes ahead of the writes waiting where the database
        runs its writes one after another (SQLite). ``claims_aware``: ``work`` takes receives'
        unwritten claims into account itself (``QueueConnection.pending_receives``: a
        receive, an ack, a release); any other write sees them written."""
        ...

    async def read(self, work: Callable[[QueueConnection], T]) -> T: ...

    async def purge_finished(self, *, before_ms: int, limit: int = 5000) -> int:
        """Forget finished messages older than the retention window."""
        ...

    async def check(self) -> builtins.list[str]:
        """Integrity problems found (empty when sound)."""
        ...
