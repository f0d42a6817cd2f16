"""Claims against the SQLite store's concurrent reader: reads run on their own connection and
thread, so a fetch can read an older snapshot while a delivery's removal commits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.contract.test_store_contract import NOW, message

from tarry.model.state import MessageState
from tarry.store.sqlite import SQLiteStore


async def test_a_message_finished_while_a_fetch_is_reading_is_never_fetched_again(
    tmp_path: Path,
) -> None:
    # Given many due messages, removed batch by batch while the next fetch already reads (as
    # the dispatcher does), with fast commits so a removal lands inside the next fetch's read
    store = SQLiteStore(tmp_path / "t.db", synchronous="normal")
    await store.open()
    try:
        await store.store([message() for _ in range(5000)])
        seen: dict[str, int] = {}
        finished: list[str] = []
        while True:
            fetching = asyncio.ensure_future(store.fetch_due(NOW, limit=500, lease_ms=60_000))
            if finished:
                await store.remove(finished, state=MessageState.DELIVERED, now_ms=NOW)
            due = await fetching
            for m in due:
                seen[m.id] = seen.get(m.id, 0) + 1
            if not due and not finished:
                break
            finished = [m.id for m in due]
    finally:
        await store.close()
    # Then each was handed out exactly once
    assert len(seen) == 5000 and max(seen.values()) == 1
