"""What the console's overview and dead-letter views read besides the per-message API: the due
forecast (from the store's due index, ``DelayedStore.due_counts``) and the dead letters of a
queue grouped by reason and original destination (from the queue database)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from tarry.store.base import DelayedStore, QueueDatabase

__all__ = ["FORECAST_SERIES", "ForecastCache", "dead_letter_groups"]

MINUTE_MS = 60_000
#: (name, window width, windows): the next hour per minute, the next day per hour, the next 30
#: days per day, each starting at the current minute.
FORECAST_SERIES: tuple[tuple[str, int, int], ...] = (
    ("next_hour", MINUTE_MS, 60),
    ("next_day", 60 * MINUTE_MS, 24),
    ("next_30_days", 24 * 60 * MINUTE_MS, 30),
)


@dataclass
class ForecastCache:
    """The forecast, computed at most once per ``max_age_ms``: a SQL store counts it with a
    range scan of its due index, which a few consoles polling every few seconds must not
    repeat for each of them."""

    max_age_ms: int = 5_000
    _taken_ms: int | None = None
    _value: dict[str, Any] | None = None
    _lock: asyncio.Lock | None = None

    async def get(self, store: DelayedStore, now_ms: int) -> dict[str, Any]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            fresh = self._taken_ms is not None and now_ms - self._taken_ms < self.max_age_ms
            if self._value is None or not fresh:
                self._value = await forecast(store, now_ms)
                self._taken_ms = now_ms
            return self._value


async def forecast(store: DelayedStore, now_ms: int) -> dict[str, Any]:
    start = now_ms - now_ms % MINUTE_MS
    series = {}
    for name, width, windows in FORECAST_SERIES:
        counts = await store.due_counts(start, width, windows)
        series[name] = {"start": start, "width_ms": width, "counts": counts}
    return {"computed_at": now_ms, **series}


def _groups(conn: sqlite3.Connection, queue: str) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    oldest: dict[tuple[str, str], int] = {}
    newest: dict[tuple[str, str], int] = {}
    rows = conn.execute(
        "SELECT deaths FROM messages WHERE queue = ? AND state IN ('ready', 'delivered')",
        (queue,),
    )
    for (deaths,) in rows:
        first = orjson.loads(deaths)[0] if deaths else {}
        key = (str(first.get("reason", "")), str(first.get("destination", "")))
        died = int(first.get("time", 0))
        counts[key] += 1
        oldest[key] = min(oldest.get(key, died), died)
        newest[key] = max(newest.get(key, died), died)
    return [
        {
            "reason": reason,
            "original_destination": destination,
            "count": count,
            "oldest": oldest[(reason, destination)],
            "newest": newest[(reason, destination)],
        }
        for (reason, destination), count in sorted(counts.items())
    ]


async def dead_letter_groups(qdb: QueueDatabase, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in ``queue`` (ready or in flight) by the reason and the original
    destination of their first death (``deaths[0]``, what redrive sends them back to); a
    message that never died counts under empty strings. Reads the queue's rows once."""
    return await qdb.read(lambda conn: _groups(conn, queue))
