"""What the console's overview and dead-letter views read besides the per-message API: the due
forecast (from the store's due index, ``DelayedStore.due_counts``) and the dead letters of a
queue grouped by reason and original destination (from the queue database)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tarry.engine.context import EngineContext
from tarry.queues.counts import death_groups, with_never_died
from tarry.store.base import DelayedStore
from tarry.store.sql import QueueConnection

__all__ = ["FORECAST_SERIES", "ForecastCache", "dead_letter_groups", "dead_letters"]

MINUTE_MS = 60_000
#: (name, window width, windows, how long a count is served before it is counted again): the
#: next hour per minute, the next day per hour, the next 30 days per day, each from the
#: current minute. A SQL store counts a series with a range scan of its due index (10 million
#: pending over 30 days: seconds), so the long series are counted seldom.
FORECAST_SERIES: tuple[tuple[str, int, int, int], ...] = (
    ("next_hour", MINUTE_MS, 60, 5_000),
    ("next_day", 60 * MINUTE_MS, 24, 60_000),
    ("next_30_days", 24 * 60 * MINUTE_MS, 30, 300_000),
)
#: How long a request waits for a series being counted before it answers without it.
WAIT_S = 0.25


@dataclass
class _Series:
    value: dict[str, Any] | None = None
    task: asyncio.Task[dict[str, Any]] | None = None


@dataclass
class ForecastCache:
    """The forecast, series by series: each is counted in the background when it is older
    than its age limit, and a request never waits for a count more than ``WAIT_S``: it gets
    the last count (its ``computed_at`` says when) or, before the first one is done, null."""

    _series: dict[str, _Series] = field(default_factory=dict)

    async def get(self, store: DelayedStore, now_ms: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "computed_at": now_ms,
            "scheduled": await self.scheduled(store, now_ms),
        }
        waiting: list[asyncio.Task[dict[str, Any]]] = []
        for name, width, windows, max_age_ms in FORECAST_SERIES:
            series = self._series.setdefault(name, _Series())
            stale = series.value is None or now_ms - series.value["computed_at"] >= max_age_ms
            if stale and series.task is None:
                series.task = asyncio.create_task(_count(store, now_ms, width, windows))
                series.task.add_done_callback(partial(_done, series))
            if series.value is None and series.task is not None:
                waiting.append(series.task)
        if waiting:
            await asyncio.wait(waiting, timeout=WAIT_S)
        for name, *_ in FORECAST_SERIES:
            out[name] = self._series[name].value
        return out

    async def scheduled(self, store: DelayedStore, now_ms: int) -> int | None:
        """Every scheduled message, counted in the background at most once a minute (a SQL
        store counts its due index); None before the first count is done."""
        series = self._series.setdefault("scheduled", _Series())
        if series.task is None and (
            series.value is None or now_ms - series.value["computed_at"] >= 60_000
        ):
            series.task = asyncio.create_task(_total(store, now_ms))
            series.task.add_done_callback(partial(_done, series))
        if series.value is None and series.task is not None:
            await asyncio.wait([series.task], timeout=WAIT_S)
        return None if series.value is None else int(series.value["count"])


async def _total(store: DelayedStore, now_ms: int) -> dict[str, Any]:
    return {"count": await store.count_scheduled(), "computed_at": now_ms}


def _done(series: _Series, task: asyncio.Task[dict[str, Any]]) -> None:
    series.task = None
    if not task.cancelled() and task.exception() is None:
        series.value = task.result()


async def _count(store: DelayedStore, now_ms: int, width_ms: int, windows: int) -> dict[str, Any]:
    start = now_ms - now_ms % MINUTE_MS
    counts = await store.due_counts(start, width_ms, windows)
    return {"start": start, "width_ms": width_ms, "counts": counts, "computed_at": now_ms}


async def dead_letter_groups(ctx: EngineContext, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in ``queue`` (ready or in flight) by the reason and the original
    destination of their first death (``deaths[0]``, what redrive sends them back to); a
    message that never died counts under empty strings. Reads the queue's rows once."""

    def work(conn: QueueConnection) -> list[dict[str, Any]]:
        return death_groups(conn, queue)

    # Counted where they are, not written out first (the console polls this).
    groups, ready, in_flight = await ctx.read_beside(queue, work)
    return with_never_died(groups, ready + in_flight)


async def dead_letters(ctx: EngineContext) -> list[dict[str, Any]]:
    """Each dead-letter queue (the error queue, every queue some queue's arguments in force
    dead-letter into, and every route's ``dead_letter_to``) with its messages grouped by
    ``deaths[0]``."""
    targets = {ctx.config.dispatch.error_queue}
    for entry in ctx.catalog.queues.values():
        if entry.effective.dead_letter_to is not None:
            targets.add(entry.effective.dead_letter_to)
    for route in ctx.transports:
        policy = ctx.policy_for(route)
        if policy is not None and policy.dead_letter_to is not None:
            targets.add(policy.dead_letter_to)
    return [
        {"queue": name, "groups": await dead_letter_groups(ctx, name)}
        for name in sorted(targets)
        if name in ctx.catalog.queues
    ]
