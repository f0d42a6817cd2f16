"""The engine's housekeeping loops: expired messages swept out of queues, unused queues
deleted, finished messages forgotten after ``retention_ms``, and the store breaker closed once
the store can write again (``StoreProbe``, which a refused send also tries); the delivery lag
of the queues being consumed sampled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tarry.dispatch.breaker import Breakers
from tarry.engine.context import EngineContext
from tarry.engine.queue_admin import drop_queue
from tarry.errors import TarryError
from tarry.queues.lag import SAMPLE_MS, QueueHead, read_head
from tarry.queues.txn import QueueTxn
from tarry.store.base import DelayedStore
from tarry.store.sql import QueueConnection

__all__ = ["StoreProbe", "housekeeping", "sample_delivery_lag", "sweep"]

log = logging.getLogger(__name__)


async def housekeeping(
    ctx: EngineContext, *, breakers: Breakers, probe: Callable[[], Awaitable[bool]]
) -> None:
    """Sweep expired messages out of queues, delete unused queues, forget old messages; and,
    beside it, sample the delivery lag (one task group: a failure restarts both)."""
    async with asyncio.TaskGroup() as loops:
        loops.create_task(_tidy(ctx, breakers=breakers, probe=probe))
        loops.create_task(sample_delivery_lag(ctx))


async def _tidy(
    ctx: EngineContext, *, breakers: Breakers, probe: Callable[[], Awaitable[bool]]
) -> None:
    interval = ctx.config.dispatch.expiry_sweep_ms / 1000
    purge_every, since_purge = 60.0, 0.0
    while True:
        await asyncio.sleep(interval)
        if breakers.store.is_open and await probe():
            # Idle or not, the breaker closes once the store can write again.
            breakers.store.success()
        try:
            await sweep(ctx)
            since_purge += interval
            if since_purge >= purge_every:
                since_purge = 0.0
                cutoff = ctx.clock.now_ms() - ctx.config.server.retention_ms
                await ctx.qdb.purge_finished(before_ms=cutoff)
        except TarryError as exc:
            breakers.store.failure(exc)
            log.warning("housekeeping failed: %s", exc)


async def sweep(ctx: EngineContext) -> None:
    now = ctx.clock.now_ms()

    def work(conn: QueueConnection) -> QueueTxn:
        txn = ctx.txn(conn, now)
        txn.sweep_expired()
        return txn

    # Rows kept in memory never expire (``memory_queues``): the look needs no write-out first.
    if await ctx.queue_db.read(lambda conn: ctx.txn(conn, now).has_expired()):
        ctx.after(await ctx.qdb.write(work))
    for name, entry in list(ctx.catalog.queues.items()):
        expires = entry.effective.expires_ms
        if (
            expires is not None
            and not ctx.waiters.count.get(name)
            and now - entry.last_used_ms >= expires
            and name != ctx.config.dispatch.error_queue
        ):
            await drop_queue(ctx, name, reason=f"expired after {expires} ms unused")


class StoreProbe:
    """The store breaker's half-open trial while it is open: one small durable write
    (``DelayedStore.probe``) tells whether the fault cleared. Callers arriving while one
    is under way share it (a burst of refused sends makes one probe, not one each)."""

    def __init__(self, store: DelayedStore) -> None:
        self._store = store
        self._probing: asyncio.Future[bool] | None = None

    async def __call__(self) -> bool:
        if self._probing is None:
            self._probing = asyncio.ensure_future(self._probe_once())
        return await asyncio.shield(self._probing)

    async def _probe_once(self) -> bool:
        try:
            await self._store.probe()
            return True
        except TarryError:
            return False
        finally:
            self._probing = None


async def sample_delivery_lag(ctx: EngineContext) -> None:
    """Every ``SAMPLE_MS``, the delivery lag of each queue being consumed, in one read: sends
    read the last figures (``tarry.queues.lag``), never the database."""
    lag, dispatch = ctx.waiters.lag, ctx.config.dispatch
    while True:
        await asyncio.sleep(SAMPLE_MS / 1000)
        wanted = lag.to_sample(
            ctx.clock.now_ms(),
            window_ms=dispatch.delivery_lag_window_ms,
            waiting=ctx.waiters.count,
            limit_ms=dispatch.overload_lag_ms,
        )
        if not wanted:
            continue

        def work(
            conn: QueueConnection, wanted: dict[str, int] = wanted
        ) -> list[tuple[str, QueueHead]]:
            return [(queue, read_head(conn, queue, cap)) for queue, cap in wanted.items()]

        try:
            # Read without writing the rows kept in memory out: they are added here.
            heads = await ctx.queue_db.read(work)
        except TarryError as exc:  # the figures stay as last sampled; receives fail alike
            log.warning("could not sample the queues' delivery lag: %s", exc)
            await asyncio.sleep(1.0)
            continue
        if ctx.memory is not None:
            memory = ctx.memory
            heads = [(queue, memory.with_head(queue, head, wanted[queue])) for queue, head in heads]
        lag.sampled(ctx.clock.now_ms(), heads, limit_ms=dispatch.overload_lag_ms)
