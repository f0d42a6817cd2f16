"""The clean-close record (``store/log/clean.py``): a restart after a clean close takes the
snapshot's partition sizes without a ``stat`` per partition; a missing, stale or damaged record,
or a crash after the restart that took it, falls back to checking every partition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tarry.errors import Unavailable
from tarry.model.message import Message
from tarry.store.log import LogStore
from tarry.store.log.clean import CLEAN
from tarry.store.log.layout import Layout
from tests.store.test_log_recovery import NOW, G, crash, message, opened


def segment_stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every ``os.stat`` of a segment file from now on."""
    seen: list[str] = []
    real = os.stat

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if "seg-" in str(path):
            seen.append(str(path))
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", stat)
    return seen


async def pending_ids(store: LogStore) -> list[str]:
    """Every message due, fetched until none is left (overdue partitions come a few at a
    time)."""
    ids: list[str] = []
    while due := await store.fetch_due(NOW + 100 * G, limit=1000, lease_ms=10**9):
        ids += [m.id for m in due]
    return sorted(ids)


async def closed_cleanly(root: Path, partitions: int) -> list[Message]:
    """One message in each of ``partitions`` partitions, stored, then a clean close."""
    store = await opened(root)
    batch = [message(NOW + 10 + i * G) for i in range(partitions)]
    await store.store(batch)
    await store.close()
    return batch


async def test_a_clean_restart_checks_no_partition_and_takes_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given messages over 20 partitions and a clean close
    batch = await closed_cleanly(tmp_path, 20)
    assert (tmp_path / CLEAN).exists()
    # When the store restarts
    stats = segment_stats(monkeypatch)
    store = await opened(tmp_path)
    # Then no segment was looked at, the record is used up, and everything is pending
    assert stats == []
    assert store.clean_start
    assert not (tmp_path / CLEAN).exists()
    assert store.state.replayed_records == 0
    assert await store.count_scheduled() == len(batch)
    assert await pending_ids(store) == sorted(m.id for m in batch)
    assert await store.check() == []
    await store.close()


async def test_a_crash_after_a_clean_restart_checks_every_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a clean close, a restart, more messages in the same partitions, and a crash
    first = await closed_cleanly(tmp_path, 5)
    store = await opened(tmp_path)
    second = [message(NOW + 20 + i * G) for i in range(5)]
    await store.store(second)
    await crash(store)
    # When the store recovers
    stats = segment_stats(monkeypatch)
    store = await opened(tmp_path)
    # Then it looked at the files, and the messages written after the restart are there too
    assert stats and not store.clean_start
    assert store.state.replayed_records == len(second)
    assert await pending_ids(store) == sorted(m.id for m in first + second)
    await store.close()


async def test_a_stale_record_naming_an_older_snapshot_is_not_trusted(tmp_path: Path) -> None:
    # Given a record kept from a clean close, then a later snapshot, more messages and a crash
    first = await closed_cleanly(tmp_path, 1)
    stale = (tmp_path / CLEAN).read_bytes()
    store = await opened(tmp_path)
    second = [message(NOW + 10 + 3 * G), message(NOW + 20)]  # a new partition, an old one
    await store.store(second[:1])
    await store.snapshot()
    await store.store(second[1:])
    await crash(store)
    # When the stale record is put back and the store recovers
    (tmp_path / CLEAN).write_bytes(stale)
    store = await opened(tmp_path)
    # Then it was set aside and every message is there
    assert not (tmp_path / CLEAN).exists()
    assert await pending_ids(store) == sorted(m.id for m in first + second)
    assert await store.check() == []
    await store.close()


async def test_a_record_whose_partitions_are_not_all_on_disk_is_not_trusted(
    tmp_path: Path,
) -> None:
    # Given a record kept from a clean close over three partitions, messages appended to one
    # after a restart and a crash (same snapshot), and another partition's directory gone
    batch = await closed_cleanly(tmp_path, 3)
    record = (tmp_path / CLEAN).read_bytes()
    store = await opened(tmp_path)
    later = message(NOW + 20 + 2 * G)
    await store.store([later])
    gone = store.partitions[Layout.level0(batch[0].deliver_at_ms // G)]
    await crash(store)
    for path, _ in gone.on_disk():
        path.unlink()
    (tmp_path / CLEAN).write_bytes(record)
    # When the store restarts
    store = await opened(tmp_path)
    # Then the record (two partitions found, three named) was not trusted: the late one is there
    assert await pending_ids(store) == sorted(m.id for m in [*batch[1:], later])
    await store.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
async def test_a_damaged_record_is_ignored(tmp_path: Path, damage: str) -> None:
    # Given a clean close, then messages appended behind its back (as a crash would leave)
    batch = await closed_cleanly(tmp_path, 4)
    record = bytearray((tmp_path / CLEAN).read_bytes())
    store = await opened(tmp_path)
    later = [message(NOW + 30 + i * G) for i in range(4)]
    await store.store(later)
    await crash(store)
    # When the record is put back damaged
    if damage == "flip":
        record[-3] ^= 0x20
    elif damage == "truncate":
        record = record[:10]
    else:
        record = bytearray()
    (tmp_path / CLEAN).write_bytes(bytes(record))
    store = await opened(tmp_path)
    # Then it is ignored and deleted, and the files are checked: nothing is missing
    assert not (tmp_path / CLEAN).exists()
    assert await pending_ids(store) == sorted(m.id for m in batch + later)
    await store.close()


async def test_no_write_is_taken_once_the_close_is_recorded(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    await store.store([message(NOW + 10)])
    await store.close()
    assert store.writer.sealed
    partition = next(iter(store.partitions.values()))
    with pytest.raises(Unavailable):
        await store.writer.append([(partition, b"late")], durable=True)


async def test_a_close_with_a_write_after_the_snapshot_records_nothing(tmp_path: Path) -> None:
    # Given a store whose closing snapshot races a write
    store = await opened(tmp_path)
    await store.store([message(NOW + 10)])
    snapshot = store.snapshot
    late = message(NOW + 20 + G)

    async def snapshot_then_write() -> Path | None:
        path = await snapshot()
        await store.store([late])
        return path

    store.snapshot = snapshot_then_write  # type: ignore[method-assign]
    await store.close()
    # Then no clean close is recorded, and the late message survives the restart
    assert not (tmp_path / CLEAN).exists()
    store = await opened(tmp_path)
    assert late.id in await pending_ids(store)
    await store.close()
