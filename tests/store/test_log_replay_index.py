"""What a restart reads once: a partition read whole (no snapshot covers any of it) is indexed
from that read when it is current or within ``prefetch_ms`` (``opening._current``), instead of
being read a second time once the store runs; and the start-up scrub reads only what recovery
did not (``Partition.unchecked``)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from tarry.model.state import MessageState
from tarry.store.log import LogStore, opening, scrub
from tarry.store.log.partition import Partition
from tests.store.test_log_indexing import LEASE, _in_due_order, _released
from tests.store.test_log_reading import _flip_a_byte_of
from tests.store.test_log_recovery import NOW, G, crash, message, opened

#: The partition that holds ``NOW``, and one far ahead of it.
CURRENT = NOW // G * G
FAR = CURRENT + 100 * G


@pytest.fixture
def opening_at(monkeypatch: pytest.MonkeyPatch):
    """Open stores as if the wall clock read the time given."""

    def at(now_ms: int) -> None:
        class Clock:
            def now_ms(self) -> int:
                return now_ms

        monkeypatch.setattr(opening, "SystemClock", Clock)

    return at


def _holding(store: LogStore, time_ms: int) -> Partition:
    [partition] = [p for p in store.partitions.values() if p.start_ms <= time_ms < p.end_ms]
    return partition


async def test_the_current_partition_read_by_recovery_is_indexed_from_that_read(
    tmp_path: Path, opening_at
) -> None:
    # Given messages in the current partition (one cancelled, one released) and in one far
    # ahead, a crash, and no snapshot left (a first minute's crash, or damaged snapshots)
    store = await opened(tmp_path)
    current = [message(NOW + 1 + k * 7 % (G // 2)) for k in range(300)]
    far = [message(FAR + k) for k in range(50)]
    await store.store(current + far)
    await store.cancel(current[5].id, now_ms=NOW)
    [first] = await store.fetch_due(current[0].deliver_at_ms, limit=1, lease_ms=LEASE)
    assert first.id == current[0].id
    await store.remove([first.id], state=MessageState.DELIVERED, now_ms=NOW)
    await store.writer.drain()
    await crash(store)
    shutil.rmtree(tmp_path / "snapshots")
    # When the store opens again at NOW
    opening_at(NOW)
    store = await opened(tmp_path)
    # Then the current partition is indexed already, without the cancelled and released ones,
    # and the far one is not
    assert _holding(store, NOW).index is not None
    assert len(_holding(store, NOW).index) == len(current) - 2
    assert _holding(store, FAR).index is None
    assert store.table.building == {}
    # And each message is released once, in due order, none early
    assert await _released(store, NOW) == []
    assert await _released(store, CURRENT + G) == _in_due_order(current[1:5] + current[6:])
    assert await _released(store, FAR + G) == _in_due_order(far)
    assert await store.check() == []
    await store.close()


async def test_a_partition_a_snapshot_covers_in_part_is_indexed_from_all_its_records(
    tmp_path: Path, opening_at
) -> None:
    # Given a partition far ahead when a snapshot was taken (not indexed: the snapshot holds
    # its sizes, not an index), more messages in it after the snapshot, and a crash
    store = await opened(tmp_path)
    before = [message(FAR + 10 + k) for k in range(40)]
    await store.store(before)
    assert await store.snapshot() is not None
    after = [message(FAR + 100 + k) for k in range(40)]
    await store.store(after)
    await store.writer.drain()
    await crash(store)
    # When the store opens again once that partition is current
    opening_at(FAR + 5)
    store = await opened(tmp_path)
    # Then recovery read only what the snapshot did not cover, so it did not index the
    # partition from that; indexed once the store runs, it holds every message
    assert _holding(store, FAR).index is None
    assert await _released(store, FAR + G) == _in_due_order(before + after)
    assert await store.check() == []
    await store.close()


async def test_a_partition_due_in_full_is_left_to_the_rounds(tmp_path: Path, opening_at) -> None:
    # Given messages in a partition, and a crash; the store opens once it is over
    store = await opened(tmp_path)
    sent = [message(NOW + 1 + k) for k in range(30)]
    await store.store(sent)
    await store.writer.drain()
    await crash(store)
    opening_at(CURRENT + 3 * G)
    store = await opened(tmp_path)
    # Then recovery did not index it (overdue partitions are indexed a few at a time, as the
    # rounds take them), and every message is still released once
    assert all(p.index is None for p in store.partitions.values())
    assert await _released(store, CURRENT + 3 * G) == _in_due_order(sent)
    await store.close()


@pytest.fixture
def scrubbed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int]]]:
    """(partition, lengths) of each partition the start-up scrub reads."""
    reads: list[tuple[int, list[int]]] = []
    read = scrub.scrub_partition

    def counted(partition: Any, lengths: list[int]) -> list[str]:
        reads.append((partition.number, list(lengths)))
        return read(partition, lengths)

    monkeypatch.setattr(scrub, "scrub_partition", counted)
    return reads


async def _scrub_done(store: LogStore) -> None:
    for _ in range(500):
        if store.scrub_done:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the start-up scrub did not finish")


async def test_the_scrub_reads_nothing_recovery_read_whole(
    tmp_path: Path, opening_at, scrubbed
) -> None:
    # Given two partitions, a crash and no snapshot
    store = await opened(tmp_path)
    await store.store([message(NOW + 1 + k) for k in range(20)])
    await store.store([message(FAR + k) for k in range(20)])
    await store.writer.drain()
    await crash(store)
    shutil.rmtree(tmp_path / "snapshots")
    # When the store opens again
    opening_at(NOW)
    store = await opened(tmp_path)
    await _scrub_done(store)
    # Then recovery read every record of both, checking each as the scrub does, and the
    # scrub read none of them again
    assert store.state.replayed_records == 40
    assert scrubbed == []
    assert store.scrubbed == 2
    await store.close()


async def test_the_scrub_reads_what_a_snapshot_covered(
    tmp_path: Path, opening_at, scrubbed
) -> None:
    # Given a partition half covered by a snapshot, the rest written after it, a crash, and
    # a record of the covered half damaged
    store = await opened(tmp_path)
    await store.store([message(FAR + k, b"old-%03d" % k) for k in range(20)])
    assert await store.snapshot() is not None
    covered = list(_holding(store, FAR).written)
    await store.store([message(FAR + 100 + k, b"new-%03d" % k) for k in range(20)])
    await store.writer.drain()
    store.files.flush()  # the partitions' bytes on disk, as a later write would leave them
    await crash(store)
    _flip_a_byte_of(tmp_path, b"old-011")
    # When the store opens again
    opening_at(NOW)
    store = await opened(tmp_path)
    await _scrub_done(store)
    # Then the scrub read the covered bytes, and only those, and found the damage there
    assert scrubbed == [(_holding(store, FAR).number, covered)]
    [line] = store.state.damaged
    assert "at byte" in line
    await store.close()
