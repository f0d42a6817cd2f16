"""Consumers' side of the local queues: receive (look, then take in one transaction; or wait
for a release to fill the queue; optionally acking the last batch's receipts in the take's
transaction) and settle (ack, requeue or reject by receipt).
``Engine.receive``, ``Engine.ack`` and ``Engine.nack`` call these with the engine's context: the
HTTP API, the client and the CLI go through them. What a queue does with its messages is
``tarry.queues.txn``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

from tarry.engine.context import EngineContext
from tarry.engine.types import Deliveries
from tarry.errors import InvalidArgument, NotFound
from tarry.model.time import wait_at_most
from tarry.queues.row_messages import ReceivedRows
from tarry.queues.txn import QueueTxn
from tarry.store.base import QueueDatabase
from tarry.store.sql import QueueConnection

__all__ = ["DEFAULT_VISIBILITY_MS", "MAX_VISIBILITY_MS", "check_receipts", "receive", "settle"]

DEFAULT_VISIBILITY_MS = 30_000
MAX_VISIBILITY_MS = 12 * 3_600_000


async def receive(
    ctx: EngineContext,
    queue: str,
    *,
    max_messages: int = 1,
    wait_ms: int = 0,
    visibility_ms: int | None = None,
    ack: Sequence[str] | None = None,
) -> Deliveries:
    """Up to ``max_messages`` ready messages, waiting up to ``wait_ms`` for the first. ``ack``:
    receipts of messages taken before, acked in the transaction of the first look, so before
    any wait (a consumer's ack and its next receive in one round trip and one commit); what
    that ack did is the answer's ``settled``."""
    if not 1 <= max_messages <= 1000:
        raise InvalidArgument(f"max ({max_messages}) must be between 1 and 1000")
    if not 0 <= wait_ms <= 20_000:
        raise InvalidArgument(f"wait_ms ({wait_ms}) must be between 0 and 20000")
    visibility = DEFAULT_VISIBILITY_MS if visibility_ms is None else visibility_ms
    if not 1 <= visibility <= MAX_VISIBILITY_MS:
        raise InvalidArgument(
            f"visibility_ms ({visibility}) must be between 1 and {MAX_VISIBILITY_MS}"
        )
    entry = ctx.catalog.queues.get(queue)
    if entry is None:
        raise NotFound(f"no queue named {queue!r}")
    to_ack = () if ack is None else check_receipts(ack, "ack")
    settled = None if ack is None else _answer((0, []), ack=True)
    memory, db = ctx.memory, ctx.queue_db
    if to_ack:  # those held in memory acked before the take, as the database's path does
        settled_here, to_ack = await _ack_in_memory(ctx, queue, to_ack)
        settled = settled_here or settled
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    if wait_ms:
        ctx.waiters.count[queue] += 1
    try:
        while True:
            event = ctx.waiters.event(queue)
            now = ctx.clock.now_ms()
            entry.last_used_ms = now
            from_memory = memory is not None and memory.takes(queue, visibility_ms=visibility)
            if memory is not None and not from_memory and memory.ready_in(queue):
                await memory.write_out_ready(queue)  # too short a visibility timeout for memory
            if from_memory and not to_ack and ctx.waiters.nothing_takeable(queue, now_ms=now):
                taken = ReceivedRows([], [], now)
            else:
                taken, acked = await _take(ctx, db, queue, now, max_messages, visibility, to_ack)
                if acked is not None:
                    settled, to_ack = _merged(settled, acked), ()
            if memory is not None and len(taken) < max_messages and from_memory:
                more = memory.take(
                    queue, max_messages - len(taken), now_ms=now, visibility_ms=visibility
                )
                taken = _joined(taken, more)
            ctx.waiters.lag.received(
                queue, taken=len(taken), emptied=_emptied(taken, max_messages), now_ms=now
            )
            if taken or queue not in ctx.catalog.queues:
                return Deliveries(taken, settled)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Deliveries(ReceivedRows([], [], now), settled)
            # Re-look at least every second: a visibility timeout ending wakes nobody.
            await wait_at_most(event, min(remaining, 1.0))
    finally:
        if wait_ms:
            ctx.waiters.count[queue] -= 1


async def _take(
    ctx: EngineContext,
    db: QueueDatabase,
    queue: str,
    now: int,
    max_messages: int,
    visibility: int,
    to_ack: Sequence[str],
) -> tuple[ReceivedRows, tuple[int, list[str]] | None]:
    """A receive's take in the queue database (and its ack of ``to_ack``, in the same
    transaction), or nothing when a look finds nothing takeable there; either way, when it
    leaves nothing takeable, the queues kept in memory are taken from next
    (``Waiters.found_nothing``)."""

    def work(
        conn: QueueConnection,
    ) -> tuple[QueueTxn, ReceivedRows, tuple[int, list[str]] | None]:
        txn = ctx.txn(conn, now)
        acked = txn.settle(queue, to_ack, ack=True, requeue=False) if to_ack else None
        taken = txn.receive(queue, max_messages=max_messages, visibility_ms=visibility)
        return txn, taken, acked

    # Look before taking (an empty poll costs a read, not a commit), unless the queue was
    # filled since a receive last emptied it: then the look is a hand-over to the reading
    # thread that only delays the take (a woken long-poll, a consumer keeping up with a
    # backlog). Receipts to ack make it a write whatever the look would say.
    if (
        to_ack
        or ctx.waiters.may_hold(queue)
        or await db.read(partial(_has_ready, ctx, queue=queue, now_ms=now))
    ):
        txn, taken, acked = await db.write(work, claims_aware=True)
        ctx.after(txn)
        emptied = _emptied(taken, max_messages)
        ctx.waiters.took(queue, emptied=emptied)
        if emptied:
            ctx.waiters.found_nothing(queue, now_ms=now)
        return taken, acked
    ctx.waiters.found_nothing(queue, now_ms=now)
    return ReceivedRows([], [], now), None


def _joined(first: ReceivedRows, then: ReceivedRows) -> ReceivedRows:
    """Two takes of one receive as one, in order."""
    if not first:
        return then
    if not then:
        return first
    joined = ReceivedRows(
        [*first.rows, *then.rows], [*first.receipts, *then.receipts], first.received_at_ms
    )
    joined.more = then.more
    return joined


async def _ack_in_memory(
    ctx: EngineContext, queue: str, receipts: Sequence[str]
) -> tuple[dict[str, Any] | None, Sequence[str]]:
    """The ack of the receipts of rows in flight in memory (None: none there), and the other
    receipts, for the queue database."""
    memory = ctx.memory
    if memory is None:
        return None, receipts
    here, elsewhere = memory.split(receipts)
    if not here:
        return None, elsewhere
    return _answer(await memory.ack(queue, here), ack=True), elsewhere


def _merged(settled: dict[str, Any] | None, acked: tuple[int, list[str]]) -> dict[str, Any]:
    """What the ack of the receipts held in memory (``settled``) and of the others came to."""
    done = _answer(acked, ack=True)
    if settled is not None:
        done["acked"] += settled["acked"]
        done["unknown"] = [*settled["unknown"], *done["unknown"]]
    return done


def _emptied(taken: ReceivedRows, asked: int) -> bool:
    """Whether a receive left nothing takeable: it took fewer than it asked for, or all there
    was."""
    return len(taken) < asked or not taken.more


def _has_ready(ctx: EngineContext, conn: QueueConnection, *, queue: str, now_ms: int) -> bool:
    return ctx.txn(conn, now_ms).has_ready(queue)


async def settle(
    ctx: EngineContext, queue: str, receipts: Sequence[str], *, ack: bool, requeue: bool
) -> dict[str, Any]:
    """Ack (``ack``), or nack: requeue (``requeue``) or reject (dead-letter) by receipt."""
    if queue not in ctx.catalog.queues:
        raise NotFound(f"no queue named {queue!r}")
    checked = check_receipts(receipts)
    settled_here: dict[str, Any] | None = None
    if ack:
        settled_here, checked = await _ack_in_memory(ctx, queue, checked)
        if settled_here is not None and not checked:
            return settled_here
    now = ctx.clock.now_ms()

    def work(conn: QueueConnection) -> tuple[QueueTxn, tuple[int, list[str]]]:
        txn = ctx.txn(conn, now)
        settled = txn.settle(queue, checked, ack=ack, requeue=requeue)
        return txn, settled

    # An ack writes the claims it settles itself; a nack has them written first (and the
    # rows kept in memory, ``memory_queues``).
    txn, settled = await ctx.qdb.write(work, claims_aware=ack)
    ctx.after(txn)
    return _merged(settled_here, settled) if ack else _answer(settled, ack=False)


def check_receipts(receipts: object, field: str = "receipts") -> Sequence[str]:
    """``receipts`` as given to ack or nack (or as receive's ``ack``: ``field``), or why they
    cannot be."""
    if not isinstance(receipts, list | tuple) or not all(isinstance(r, str) for r in receipts):
        raise InvalidArgument(f"{field} must be a list of receipt strings from receive")
    return receipts


def _answer(settled: tuple[int, list[str]], *, ack: bool) -> dict[str, Any]:
    done, unknown = settled
    return {("acked" if ack else "nacked"): done, "unknown": unknown}
