"""Finding messages by id in the log store without an id index: a batch of ids reads each
partition it names once, however many of its ids fall there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tarry.store.log.locate as locate_module
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.store.log import LogStore
from tarry.store.log.partition import Partition

NOW = 1_700_000_000_000


def _message(i: int, ids: IdGenerator) -> Message:
    due = NOW + 3_600_000 + i
    return Message(
        id=ids.new_due(NOW, due),
        destination="q",
        body=b"x" * 50,
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due,
        expires_at_ms=None,
        message_id=f"m-{i}",
        updated_at_ms=NOW,
    )


async def test_a_rerun_batch_reads_each_partition_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LogStore(tmp_path / "log", granularity_ms=60_000)
    await store.open()
    try:
        ids = IdGenerator()
        first = [_message(i, ids) for i in range(200)]  # 200 ms apart from 1 h: one partition
        await store.store(first)
        reads: list[int] = []
        segments = locate_module._segments

        def counted(partition: Partition) -> Iterator[tuple[int, bytes]]:
            reads.append(partition.number)
            return segments(partition)

        monkeypatch.setattr(locate_module, "_segments", counted)
        outcomes = await store.store([_message(i, ids) for i in range(200)])
        assert [o.message.id for o in outcomes] == [m.id for m in first]
        assert not any(o.created for o in outcomes)
        assert len(reads) == 1  # one pass for the 200 repeats, not one per repeat
    finally:
        await store.close()
