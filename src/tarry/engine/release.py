"""Keeping messages and releasing them when the delayed store does NOT share the queue database
(``LogStore``, ``MemoryStore``; see ``tarry.store.base`` for the contract and why this is
exactly-once). The engine uses these when ``store.shares_queue_database`` is False
(``release_path.SeparatePath``); a store that shares the database (SQLite, PostgreSQL) releases
in one transaction instead (``shared_release``). Each takes the engine's context, not the engine.

Write order, everywhere here:

1. the message is durable in the delayed store (``store.store``, fsynced per its policy);
2. release = one queue-database transaction that inserts the message into its queue keyed by
   its tarry id (``QueueTxn.enqueue(insert=True)``; an id already there means "released
   before": nothing happens), or dead-letters it, as the queue's rules say;
3. only then ``store.remove(ids, state=READY)`` appends the store's release marker.

A crash between 2 and 3 leaves the store holding a message the queue database already has: it is
fetched again, its release is a no-op, and the marker is written then. Reads (``get``,
``cancel``, listing) therefore look in the queue database first.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TypeVar

from tarry.engine.context import EngineContext
from tarry.errors import DeliveryFailed, NotCancellable, TarryError
from tarry.model.due import DueColumns
from tarry.model.message import DeathReason, Message, SendPlan
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState
from tarry.queues.lookup import find_message
from tarry.queues.txn import QueueTxn
from tarry.store.base import StoreOutcome
from tarry.store.sql import QueueConnection
from tarry.store.sqlite.rows import dedupe_key, kept_by_dedupe_key
from tarry.store.sqlite.store import ended_early, list_rows, page

__all__ = [
    "get_released",
    "give_up",
    "list_merged",
    "per_send",
    "refuse_if_released",
    "release",
    "release_now",
    "store_sends",
]

log = logging.getLogger(__name__)

Accepted = list[tuple[int, SendPlan, list[Message]]]
T = TypeVar("T")


def per_send(accepted: Accepted, everything: Sequence[T]) -> Iterator[Sequence[T]]:
    """``everything`` (one item per message of ``accepted``, in order) split per send."""
    if len(everything) == len(accepted):  # one message a send (no topic in the batch)
        for item in everything:
            yield (item,)
        return
    start = 0
    for _, _, messages in accepted:
        yield everything[start : start + len(messages)]
        start += len(messages)


async def store_sends(ctx: EngineContext, accepted: Accepted, now_ms: int) -> list[StoreOutcome]:
    """Keep every accepted message durably in the store, de-duplicated against released ones
    (queue database) and pending ones (the store). Returns one outcome per message, in order;
    ``release_now`` then releases the ones due at once."""
    messages = [m for _, _, batch in accepted for m in batch]
    keys = {k for k in map(dedupe_key, messages) if k is not None}
    if not keys and not any(m.state is MessageState.DELIVERED for m in messages):
        return await ctx.store.store(messages)  # nothing to de-duplicate or to record aside
    released: dict[str, Message] = {}
    if keys:
        # Rows kept in memory have no key (``memory_queues``): no write-out needed first.
        released = await ctx.queue_db.read(lambda conn: kept_by_dedupe_key(conn, keys))
    fresh = [m for m in messages if dedupe_key(m) not in released]
    # A message a native route already handed to its broker (state delivered) is finished: its
    # record goes straight to the queue database, never into the delayed store to fall due.
    handed = {m.id for m in fresh if m.state is MessageState.DELIVERED}
    if handed:

        def record(conn: QueueConnection) -> None:
            txn = ctx.txn(conn, now_ms)
            for message in fresh:
                if message.id in handed:
                    txn.adopt(message)

        await ctx.qdb.write(record, durable=True)
    pending = [m for m in fresh if m.id not in handed]
    stored = iter(await ctx.store.store(pending) if pending else [])
    outcomes = []
    for message in messages:
        key = dedupe_key(message)
        if key in released:
            outcomes.append(StoreOutcome(released[key], False))
        elif message.id in handed:
            outcomes.append(StoreOutcome(message, True))
        else:
            outcomes.append(next(stored))
    return outcomes


async def release_now(
    ctx: EngineContext, accepted: Accepted, outcomes: list[StoreOutcome], now_ms: int
) -> QueueTxn | None:
    """Release at once the created messages of ``accepted`` that are not delayed and go to a
    local queue. Returns the transaction whose events the caller tells after ``scheduled``."""
    now_local: list[Message] = []
    for (_, plan, _), mine in zip(accepted, per_send(accepted, outcomes), strict=True):
        if not plan.delayed:
            now_local += [
                o.message for o in mine if o.created and o.message.destination not in ctx.transports
            ]
    if not now_local:
        return None
    # A refusal (queue full, ...) or a queue database that cannot commit now leaves the
    # message scheduled and due (it is durable already): the dispatcher releases it.
    try:
        _, txn = await _release(ctx, now_local, claimed=False)
    except TarryError as exc:
        log.warning("immediate release deferred to the dispatcher: %s", exc)
        ctx.due(now_ms, now_ms)
        return None
    return txn


async def release(
    ctx: EngineContext, batch: Sequence[Message]
) -> list[tuple[Message, DeliveryFailed]]:
    """Release claimed messages into local queues: insert into the queue in one queue-database
    transaction, then the store's release markers. Returns the messages their queue refused.

    Consumers are woken (and the events told) once the queue database has committed, not after
    the markers: the messages are theirs from then on, and the marker's append may wait
    behind a producer's fsync in the log store's group commit.

    Where local queues are kept in memory, the dispatcher has offered the batch to them first
    (``ReleasePath.release_at_once``)."""
    refused, _ = await _release(ctx, batch, claimed=True, committed=ctx.after)
    return refused


async def _release(
    ctx: EngineContext,
    batch: Sequence[Message],
    *,
    claimed: bool,
    committed: Callable[[QueueTxn], None] | None = None,
) -> tuple[list[tuple[Message, DeliveryFailed]], QueueTxn]:
    def work(
        conn: QueueConnection,
    ) -> tuple[QueueTxn, list[tuple[Message, DeliveryFailed]], list[str]]:
        # The time of the transaction, not of the call: the batch may wait for the database
        # thread behind other transactions, and its messages enter their queue (and their
        # release lateness is counted) when this one runs.
        txn = ctx.txn(conn, ctx.clock.now_ms())
        refused: list[tuple[Message, DeliveryFailed]] = []
        # Plain due messages as columns (``DueColumns``): written from the columns where
        # their queues take them as they are (nothing refused, nothing dead-lettered).
        if isinstance(batch, DueColumns) and txn.enqueue_columns(batch):
            txn.flush()
            return txn, refused, batch.ids
        by_queue: dict[str, list[Message]] = {}
        for message in batch:
            by_queue.setdefault(message.destination, []).append(message)
        # ``enqueue_many`` leaves a message released before (its id already here) as it is.
        for queue, messages in by_queue.items():
            refused += txn.enqueue_many(messages, queue)
        txn.flush()
        gone = {m.id for m, _ in refused}
        return txn, refused, [m.id for m in batch if m.id not in gone]

    try:
        txn, refused, placed = await ctx.qdb.write(work, first=True, claims_aware=True)
        if committed is not None:
            committed(txn)
        if placed:
            await ctx.store.remove(placed, state=MessageState.READY, now_ms=txn.now_ms)
    except BaseException:
        if ctx.memory is not None:
            ctx.memory.released_elsewhere(_ids(batch))
        raise
    finally:
        if claimed:
            ctx.store.release_claims(_ids(batch))
    return refused, txn


def _ids(batch: Sequence[Message]) -> list[str]:
    return batch.ids if isinstance(batch, DueColumns) else [m.id for m in batch]


async def give_up(ctx: EngineContext, message: Message, error: DeliveryFailed) -> None:
    """Dead-letter (or discard) a message that cannot be delivered: adopted into the queue
    database and ended there in one transaction, then removed from the store."""
    now = ctx.clock.now_ms()
    text = f"{error.reason}: {error.message}"

    def work(conn: QueueConnection) -> QueueTxn:
        txn = ctx.txn(conn, now, ctx.failure_queue(message.destination))
        if txn.adopt(message):
            txn.dead_letter(
                message, from_queue=None, reason=DeathReason.DELIVERY_FAILED, error=text
            )
        return txn

    try:
        txn = await ctx.qdb.write(work)
        await ctx.store.remove([message.id], state=MessageState.DEAD_LETTERED, now_ms=now)
    finally:
        ctx.store.release_claims([message.id])
    ctx.after(txn)


async def get_released(ctx: EngineContext, message_id: str) -> Message | None:
    """The queue database's record of a released message (None when not released)."""
    return await ctx.qdb.read(lambda conn: find_message(conn, message_id))


async def refuse_if_released(ctx: EngineContext, message_id: str) -> None:
    """Cancel and reschedule act on scheduled messages only; a released one is past that."""
    message = await get_released(ctx, message_id)
    if message is not None:
        raise NotCancellable(
            f"message {message_id} is {message.state.value}; only scheduled messages can be changed"
        )


async def list_merged(ctx: EngineContext, query: MessageQuery) -> tuple[list[Message], str | None]:
    """Released messages (queue database) and pending ones (store), merged in (due, id) order;
    a message in both (released, marker not yet written) is shown as released."""
    limit = query.limit
    released = await ctx.qdb.read(lambda conn: list_rows(conn, query, limit + 1))
    pending: list[Message] = []
    cursor: str | None = None
    if query.state in (None, MessageState.SCHEDULED.value, MessageState.CANCELLED.value):
        pending, cursor = await ctx.store.list(replace(query, limit=limit + 1))
    seen = {m.id for m in released}
    merged = list(
        heapq.merge(
            released,
            [m for m in pending if m.id not in seen],
            key=lambda m: (m.deliver_at_ms, m.id),
        )
    )
    read_to = ended_early(cursor)
    if read_to is None:
        return page(merged, limit)
    # The store read pending messages due before ``read_to`` only: released ones due later
    # wait for the page that reads on from there.
    items, next_cursor = page([m for m in merged if m.deliver_at_ms < read_to], limit)
    return items, next_cursor or cursor
