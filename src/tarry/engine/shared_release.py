"""Releasing and giving up where the store shares the queue database (SQLite, PostgreSQL): one
transaction checks the claim, moves the message into its queue (or dead-letters it) and takes
it out of the store, so a release is exactly-once. ``tarry.engine.release`` is the other path,
for a store kept apart from the queue database."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from tarry.engine.context import EngineContext
from tarry.engine.release import Accepted, per_send
from tarry.errors import DeliveryFailed
from tarry.model.message import DeathReason, Message
from tarry.queues.txn import QueueTxn
from tarry.store.base import SharedDelayedStore, StoreOutcome
from tarry.store.sql import QueueConnection

__all__ = ["StillHeld", "give_up", "release", "store_sends"]

#: Inside the release transaction: the messages of a batch this node still holds.
StillHeld = Callable[[QueueConnection, Sequence[Message]], Sequence[Message]]


async def store_sends(
    ctx: EngineContext, accepted: Accepted, now_ms: int
) -> tuple[QueueTxn, list[StoreOutcome]]:
    """Keep every accepted message and release the ones not delayed, in one transaction.
    Returns it (its events are told after "scheduled") and one outcome per message, in order."""
    store = cast(SharedDelayedStore, ctx.store)  # this path runs only for one (``ctx.shared``)

    def work(conn: QueueConnection) -> tuple[QueueTxn, list[StoreOutcome]]:
        txn = ctx.txn(conn, now_ms)
        # One insert for the whole batch; then each plan takes back its own rows.
        everything = store.store_in(conn, [m for _, _, messages in accepted for m in messages])
        for (_, plan, _), stored in zip(accepted, per_send(accepted, everything), strict=True):
            if not plan.delayed:
                for outcome in stored:
                    if outcome.created and outcome.message.destination not in ctx.transports:
                        try:
                            txn.enqueue(outcome.message, outcome.message.destination)
                        except DeliveryFailed:
                            pass  # stays scheduled and due now: the dispatcher handles it
        return txn, everything

    return await ctx.qdb.write(work, durable=True)


async def release(
    ctx: EngineContext, batch: Sequence[Message], still_held: StillHeld
) -> list[tuple[Message, DeliveryFailed]]:
    """Release claimed messages into their local queues; returns those their queue refused.
    ``still_held`` keeps those this node still holds, their rows locked (``ClusterLink``)."""

    def work(conn: QueueConnection) -> tuple[QueueTxn, list[tuple[Message, DeliveryFailed]]]:
        txn = ctx.txn(conn, ctx.clock.now_ms())  # when it runs (see ``release._release``)
        refused = []
        # Claim check, enqueue and leaving the store commit together (exactly-once).
        for message in still_held(conn, batch):
            try:
                txn.enqueue(message, message.destination)
            except DeliveryFailed as exc:
                refused.append((message, exc))
        return txn, refused

    try:
        txn, refused = await ctx.qdb.write(work, first=True)
    finally:
        ctx.store.release_claims([m.id for m in batch])
    ctx.after(txn)
    return refused


async def give_up(ctx: EngineContext, message: Message, error: DeliveryFailed) -> None:
    """Dead-letter (or discard) a claimed message that cannot be delivered, unless it was
    cancelled or finished meanwhile."""
    now = ctx.clock.now_ms()
    text = f"{error.reason}: {error.message}"

    store = cast(SharedDelayedStore, ctx.store)  # this path runs only for one (``ctx.shared``)

    def work(conn: QueueConnection) -> QueueTxn:
        txn = ctx.txn(conn, now, ctx.failure_queue(message.destination))
        if not store.lock_for_give_up(conn, message.id, failures=message.failures):
            return txn  # cancelled or finished meanwhile
        txn.dead_letter(message, from_queue=None, reason=DeathReason.DELIVERY_FAILED, error=text)
        return txn

    try:
        txn = await ctx.qdb.write(work)
    finally:
        ctx.store.release_claims([message.id])
    ctx.after(txn)
