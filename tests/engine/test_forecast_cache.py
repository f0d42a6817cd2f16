"""The console's forecast never keeps a request waiting on a long count: a series is counted in
the background, served while it is fresh enough, and null until its first count is done
(beside the real server's test in tests/server/test_console_api.py)."""

from __future__ import annotations

import asyncio
import time

from tarry.engine.overview import ForecastCache
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.store.memory import MemoryStore

NOW = 1_700_000_040_000  # a whole minute
MINUTE = 60_000


class SlowStore(MemoryStore):
    """A memory store whose counts take ``delay_s`` (a SQL store's range scan over millions)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.counted = 0

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> list[int]:
        self.counted += 1
        await asyncio.sleep(self.delay_s)
        return await super().due_counts(start_ms, width_ms, buckets)


async def test_a_slow_count_is_served_once_done_and_not_repeated_while_fresh() -> None:
    store = SlowStore(delay_s=0.5)
    ids = IdGenerator()
    due = NOW + 3 * MINUTE
    await store.store(
        [
            Message(
                id=ids.new_due(NOW, due),
                destination="q",
                body=b"x",
                headers={},
                sent_at_ms=NOW,
                deliver_at_ms=due,
                expires_at_ms=None,
                updated_at_ms=NOW,
            )
        ]
    )
    cache = ForecastCache()
    # When the forecast is asked for while the counts take longer than a request waits
    started = time.monotonic()
    first = await cache.get(store, NOW)
    # Then the answer comes at once, without the series
    assert time.monotonic() - started < 0.45
    assert (first["next_hour"], first["next_day"], first["next_30_days"]) == (None, None, None)
    # And once the counts are done, they are served, and not counted again while fresh
    await asyncio.sleep(0.6)
    second = await cache.get(store, NOW + 1000)
    assert second["next_hour"]["counts"][3] == 1
    assert sum(second["next_30_days"]["counts"]) == 1
    assert store.counted == 3
    # When the next hour's count is over 5 s old, it alone is counted again (in the background)
    third = await cache.get(store, NOW + 6000)
    assert third["next_hour"]["computed_at"] == NOW  # the last count, meanwhile
    await asyncio.sleep(0.6)
    assert store.counted == 4
    assert (await cache.get(store, NOW + 6500))["next_hour"]["computed_at"] == NOW + 6000
