"""Declaring, inspecting and deleting local queues (``Engine.declare_queue`` and its
relatives), given the engine's context."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tarry.engine.context import EngineContext
from tarry.engine.types import QueueInfo
from tarry.errors import NotFound, PreconditionFailed
from tarry.model.queue_args import parse_queue_args
from tarry.model.validate import check_name
from tarry.queues.catalog import QueueEntry, delete_queue_rows, save_queue
from tarry.queues.counts import ready_and_in_flight
from tarry.queues.txn import QueueTxn
from tarry.store.sql import QueueConnection

__all__ = ["declare_queue", "delete_queue", "drop_queue", "list_queues", "queue_info"]

log = logging.getLogger(__name__)


async def declare_queue(
    ctx: EngineContext, name: str, args: Mapping[str, Any]
) -> tuple[QueueInfo, bool]:
    check_name(name, field="queue name")
    parsed = parse_queue_args(args)
    now = ctx.clock.now_ms()
    if name in ctx.catalog.topics or name in ctx.transports:
        raise PreconditionFailed(f"{name!r} is already a topic or a route; choose another name")
    entry = ctx.catalog.queues.get(name)
    if entry is not None:
        if entry.args != parsed:
            differing = [
                f"{k} ({v!r} in force, {parsed.to_dict()[k]!r} requested)"
                for k, v in entry.args.to_dict().items()
                if parsed.to_dict()[k] != v
            ]
            raise PreconditionFailed(
                f"queue {name!r} exists with other arguments: {', '.join(differing)}; "
                "declare it with the same arguments or delete it first"
            )
        entry.last_used_ms = now  # a redeclare renews an unused queue's lease
        existing = entry
        await ctx.qdb.write(lambda conn: save_queue(conn, existing), durable=True)
        return await queue_info(ctx, name), False
    entry = QueueEntry(name, parsed, now, now)
    await ctx.qdb.write(lambda conn: save_queue(conn, entry), durable=True)
    ctx.catalog.queues[name] = entry
    ctx.catalog.recompute()
    return await queue_info(ctx, name), True


async def queue_info(ctx: EngineContext, name: str) -> QueueInfo:
    entry = ctx.catalog.queues.get(name)
    if entry is None:
        raise NotFound(f"no queue named {name!r}")
    now = ctx.clock.now_ms()

    def work(conn: QueueConnection) -> tuple[int, int]:
        return ready_and_in_flight(conn, name, now)

    # Counted where they are, not written out first (the console polls this).
    (ready, in_flight), ready_here, in_flight_here = await ctx.read_beside(name, work)
    ready, in_flight = ready + ready_here, in_flight + in_flight_here
    scheduled = await ctx.store.count_scheduled(name)
    return QueueInfo(
        name=name,
        args=entry.args,
        effective=entry.effective,
        ready=ready,
        in_flight=in_flight,
        scheduled=scheduled,
        consumers_waiting=ctx.waiters.count.get(name, 0),
        created_at_ms=entry.created_at_ms,
        last_used_ms=entry.last_used_ms,
    )


async def list_queues(ctx: EngineContext) -> list[QueueInfo]:
    """Every queue, by name; one that expires or is deleted while the list is read (each
    ``queue_info`` awaits the queue database) is left out, not a 404 for the whole list."""
    infos = []
    for name in sorted(ctx.catalog.queues):
        try:
            infos.append(await queue_info(ctx, name))
        except NotFound:
            continue
    return infos


async def delete_queue(ctx: EngineContext, name: str) -> None:
    if name not in ctx.catalog.queues:
        raise NotFound(f"no queue named {name!r}")
    if name == ctx.config.dispatch.error_queue:
        raise PreconditionFailed(f"{name!r} is the error queue; it cannot be deleted")
    await drop_queue(ctx, name, reason="deleted")


async def drop_queue(ctx: EngineContext, name: str, *, reason: str) -> None:
    now = ctx.clock.now_ms()

    def work(conn: QueueConnection) -> QueueTxn:
        txn = ctx.txn(conn, now)
        delete_queue_rows(conn, name)
        txn.expire_queue_contents(name)
        return txn

    txn = await ctx.qdb.write(work)
    ctx.catalog.queues.pop(name, None)
    for subscribers in ctx.catalog.topics.values():
        subscribers.discard(name)
    ctx.after(txn)
    ctx.waiters.wake({name})
    log.info("queue %s %s", name, reason)
