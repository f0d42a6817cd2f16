"""A listing page of the log store reads a bounded number of messages: a filter that matches
rarely ends a page early with a cursor to read on from, instead of reading every partition
(issue 24: the console stays responsive with millions pending)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.store.log import LogStore, locate
from tarry.store.sqlite.store import ended_early

NOW = 1_700_000_000_000
MINUTE = 60_000
ids = IdGenerator()


def message(due_ms: int, correlation_id: str) -> Message:
    return Message(
        id=ids.new_due(NOW, due_ms),
        destination="q",
        body=b"x",
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due_ms,
        expires_at_ms=None,
        correlation_id=correlation_id,
        updated_at_ms=NOW,
    )


@pytest.fixture
async def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LogStore]:
    monkeypatch.setattr(locate, "SCAN_RECORDS_PER_PAGE", 10)
    s = LogStore(tmp_path / "log", granularity_ms=MINUTE)
    await s.open()
    # 30 one-minute partitions of 5 messages each; correlation id "needle" once, in the 26th
    batch = [
        message(NOW + p * MINUTE + i * 1000, "needle" if (p, i) == (25, 3) else f"hay{p}.{i}")
        for p in range(30)
        for i in range(5)
    ]
    await s.store(batch)
    yield s
    assert await s.check() == []
    await s.close()


async def test_a_rare_filter_ends_pages_early_and_the_cursors_lead_to_the_match(store) -> None:
    # When the pages of correlation id "needle" are read one after the other
    cursor, found, pages = None, [], 0
    while True:
        query = MessageQuery(correlation_id="needle", limit=10, cursor=cursor)
        items, cursor = await store.list(query)
        pages += 1
        found += items
        if cursor is None:
            break
        # Then each page that ended early read at least two partitions, never all of them
        assert ended_early(cursor) is not None or items
    assert [m.correlation_id for m in found] == ["needle"]
    assert 2 < pages <= 16


async def test_paging_by_cursor_covers_every_message_once_in_order(store) -> None:
    cursor, seen = None, []
    while True:
        items, cursor = await store.list(MessageQuery(limit=7, cursor=cursor))
        seen += items
        if cursor is None:
            break
        # A short page is one that ended early, and says so
        assert len(items) == 7 or ended_early(cursor) is not None
    assert len(seen) == 150
    assert [(m.deliver_at_ms, m.id) for m in seen] == sorted((m.deliver_at_ms, m.id) for m in seen)
