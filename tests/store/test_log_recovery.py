"""The log store's crash, corruption and lifecycle cases, one test each, on real files. Every
test ends with an integrity check (``check()``) or states which damage it expects."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.fs import OsFiles
from tarry.store.log.layout import Layout
from tarry.store.log.record import encode_message
from tarry.store.log.wal import MAGIC

NOW = 1_700_000_000_000
G = 60_000
ids = IdGenerator()


def message(due_ms: int, body: bytes = b"hello", destination: str = "q") -> Message:
    return Message(
        id=ids.new_due(NOW, due_ms),
        destination=destination,
        body=body,
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due_ms,
        expires_at_ms=None,
        updated_at_ms=NOW,
    )


def keyed(due_ms: int, message_id: str) -> Message:
    """``message`` sent with a ``message_id`` (a de-duplication key)."""
    m = message(due_ms)
    m.message_id = message_id
    return m


async def opened(root: Path, **kwargs: object) -> LogStore:
    store = LogStore(root, granularity_ms=G, **kwargs)  # type: ignore[arg-type]
    await store.open()
    return store


async def crash(store: LogStore) -> None:
    """Stop without the closing snapshot: what kill -9 leaves (the files as written)."""
    store._opened = False
    store.files.close()
    store._executor.shutdown(wait=True)


def segments(root: Path) -> list[Path]:
    return sorted((root / "parts").glob("p-*.seg-*.log"))


async def test_a_torn_partition_tail_is_written_again_from_the_wal(tmp_path: Path) -> None:
    # Given two messages acknowledged, and the partition's file cut short by a crash (its
    # bytes are fsynced only by a checkpoint; the WAL holds them)
    store = await opened(tmp_path)
    first, second = message(NOW + 10), message(NOW + 20)
    await store.store([first, second])
    store.files.flush()  # written behind the WAL, not fsynced
    await crash(store)
    [segment] = segments(tmp_path)
    segment.write_bytes(segment.read_bytes()[:-7])
    # When the store recovers
    store = await opened(tmp_path)
    # Then the WAL's tail wrote the partition's bytes again: both are due, nothing damaged
    due = await store.fetch_due(NOW + 100, limit=10, lease_ms=1000)
    assert [m.id for m in due] == [first.id, second.id]
    assert await store.check() == []
    await store.close()


async def test_a_torn_wal_tail_is_cut_and_never_served(tmp_path: Path) -> None:
    # Given a message acknowledged, and a second one whose group the power cut off halfway
    # through its WAL record (before any of it reached the partition)
    store = await opened(tmp_path)
    kept, torn = message(NOW + 10), message(NOW + 20)
    await store.store([kept])
    await store.store([torn])
    store.files.flush()
    await crash(store)
    [segment] = segments(tmp_path)
    segment.write_bytes(segment.read_bytes()[: -len(encode_message(torn))])
    wal = sorted((tmp_path / "wal").glob("wal-*.log"))[-1]
    wal.write_bytes(wal.read_bytes()[:-7])
    # When the store recovers
    store = await opened(tmp_path)
    # Then the torn group is gone (never served), the whole one is due, and a torn tail is
    # not damage
    due = await store.fetch_due(NOW + 100, limit=10, lease_ms=1000)
    assert [m.id for m in due] == [kept.id]
    assert await store.check() == []
    assert len(wal.read_bytes()) < len(MAGIC) + 200  # cut back to the whole group
    await store.close()


async def test_a_flipped_byte_in_a_closed_segment_is_reported_and_the_rest_served(
    tmp_path: Path,
) -> None:
    # Given a partition with two segments (tiny segment size) and a byte flipped in the first
    store = await opened(tmp_path, segment_bytes=4096)
    batch = [message(NOW + i, body=b"x" * 600) for i in range(12)]
    await store.store(batch)
    await store.snapshot()  # a checkpoint: the partition's bytes are its own, the WAL's gone
    await crash(store)
    first = segments(tmp_path)[0]
    assert len(segments(tmp_path)) > 1
    data = bytearray(first.read_bytes())
    data[700] ^= 0xFF
    first.write_bytes(bytes(data))
    # When the store recovers and releases everything due
    store = await opened(tmp_path, segment_bytes=4096)
    due = await store.fetch_due(NOW + 100, limit=100, lease_ms=1000)
    # Then the damaged file is named, the damaged message is not delivered, the rest is
    problems = await store.check()
    assert problems and str(first) in problems[0]
    assert all(m.body == b"x" * 600 for m in due)
    assert len(due) == len(batch) - 1
    await store.close()


async def test_messages_fall_into_time_partitions_and_roll_over(tmp_path: Path) -> None:
    # Given messages due in three consecutive partitions
    store = await opened(tmp_path)
    batch = [message(NOW + offset) for offset in (5, G + 5, 2 * G + 5)]
    await store.store(batch)
    store.files.flush()  # written behind the WAL
    assert len(list((tmp_path / "parts").glob("p-*"))) == 3
    # When time passes the first partition's end
    first = await store.fetch_due(NOW + G, limit=10, lease_ms=10 * G)
    later = await store.fetch_due(NOW + 3 * G, limit=10, lease_ms=10 * G)
    # Then each message comes in its own time, in due order
    assert [m.id for m in first] == [batch[0].id]
    assert [m.id for m in later] == [batch[1].id, batch[2].id]
    assert await store.check() == []
    await store.close()


async def test_a_partition_born_near_its_due_time_is_indexed_at_once(tmp_path: Path) -> None:
    # Given a store that has never seen the partitions of these messages
    store = await opened(tmp_path)
    near, far = message(NOW + 5), message(NOW + 100 * G)
    # When messages arrive for a partition within the prefetch horizon and one far beyond it
    await store.store([near, far])
    # Then the near partition is indexed from birth (nothing to read back when it falls due)
    # and holds its message, while the far one costs no index until it comes near
    near_index = store.partitions[Layout.level0(near.deliver_at_ms // G)].index
    assert near_index is not None and len(near_index) == 1
    assert store.partitions[store.layout.key_for(far.deliver_at_ms, NOW)].index is None
    assert [m.id for m in await store.fetch_due(NOW + 5, limit=10, lease_ms=G)] == [near.id]
    await store.remove([near.id], state=MessageState.DELIVERED, now_ms=NOW + 5)
    assert [m.id for m in await store.fetch_due(NOW + 100 * G, limit=10, lease_ms=G)] == [far.id]
    assert await store.check() == []
    await store.close()


async def test_overdue_partitions_after_downtime_are_released_in_due_order(tmp_path: Path) -> None:
    # Given messages over ten partitions and a store that was down for all of them
    store = await opened(tmp_path)
    batch = [message(NOW + k * G + 7) for k in range(10)]
    await store.store(list(reversed(batch)))
    await crash(store)
    store = await opened(tmp_path)
    # When it comes back long after
    got: list[Message] = []
    while True:
        due = await store.fetch_due(NOW + 100 * G, limit=3, lease_ms=60_000)
        if not due:
            break
        got += due
    # Then all are released, in due order
    assert [m.id for m in got] == [m.id for m in batch]
    await store.close()


async def test_released_partitions_are_deleted_with_their_files(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    batch = [message(NOW + 5), message(NOW + G + 5)]
    await store.store(batch)
    due = await store.fetch_due(NOW + 10, limit=10, lease_ms=1000)
    await store.remove([m.id for m in due], state=MessageState.READY, now_ms=NOW + 10)

    # The first partition is drained and its window over; the second still holds a message
    assert await store.delete_released(NOW + G + 1) == 1
    assert len(list((tmp_path / "parts").glob("p-*"))) == 1
    assert await store.get(batch[1].id) is not None
    await store.close()


class _UnlinkThreads(OsFiles):
    """The real file system, noting the thread of every unlink."""

    def __init__(self) -> None:
        super().__init__()
        self.unlinked_on: list[tuple[str, str]] = []

    def unlink(self, path: Path) -> None:
        self.unlinked_on.append((path.name, threading.current_thread().name))
        super().unlink(path)


async def test_a_deleted_partitions_files_are_freed_off_the_event_loop(tmp_path: Path) -> None:
    # Given a drained partition whose window is over
    fs = _UnlinkThreads()
    store = await opened(tmp_path, fs=fs)
    await store.store([message(NOW + 5)])
    due = await store.fetch_due(NOW + 10, limit=10, lease_ms=1000)
    await store.remove([m.id for m in due], state=MessageState.READY, now_ms=NOW + 10)
    # When cleanup deletes it
    assert await store.delete_released(NOW + G + 1) == 1
    # Then its segment file left parts/ and was unlinked from trash/, not on the event loop
    # (freeing a large file's blocks holds the caller)
    assert not list((tmp_path / "parts").glob("p-*"))
    segment_files = [(n, t) for n, t in fs.unlinked_on if ".seg-" in n]
    assert segment_files and all(t != threading.current_thread().name for _, t in segment_files)
    assert not list((tmp_path / "trash").iterdir())
    await store.close()


async def test_a_file_a_crash_left_in_the_trash_is_deleted_at_the_next_open(
    tmp_path: Path,
) -> None:
    # Given a store, and a file a crash left in its trash between the move and the unlink
    store = await opened(tmp_path)
    kept = message(NOW + G + 5)
    await store.store([kept])
    await crash(store)
    (tmp_path / "trash").mkdir()
    (tmp_path / "trash" / "0-p-28333333.seg-000000.log").write_bytes(b"x" * 4096)
    # When it opens again
    store = await opened(tmp_path)
    # Then the trash is gone, and nothing else was touched
    assert not (tmp_path / "trash").exists()
    assert await store.get(kept.id) is not None
    await store.close()


async def test_recovery_uses_the_snapshot_and_replays_only_the_tail(tmp_path: Path) -> None:
    # Given an indexed partition snapshotted, then more appends and a release after it
    store = await opened(tmp_path)
    before = [message(NOW + 10 + i) for i in range(50)]
    await store.store(before)
    await store.fetch_due(NOW, limit=1, lease_ms=1)  # indexes the partition
    await store.snapshot()
    after = [message(NOW + 100 + i) for i in range(5)]
    await store.store(after)
    [first] = await store.fetch_due(NOW + 10, limit=1, lease_ms=1000)
    await store.remove([first.id], state=MessageState.READY, now_ms=NOW + 10)
    await store.writer.drain()  # the deferred release marker written (not fsynced)
    await crash(store)
    # When it recovers
    store = await opened(tmp_path)
    # Then only the tail was replayed, and the index is exact
    assert store.state.manifest is not None
    assert store.state.replayed_records == len(after) + 1
    due = await store.fetch_due(NOW + 1000, limit=100, lease_ms=1000)
    assert [m.id for m in due] == [m.id for m in before[1:] + after]
    await store.close()


async def test_an_incomplete_or_damaged_snapshot_is_ignored(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    batch = [message(NOW + 10 + i) for i in range(20)]
    await store.store(batch)
    await store.fetch_due(NOW, limit=1, lease_ms=1)
    await store.snapshot()
    await crash(store)
    snapshots = tmp_path / "snapshots"
    [part] = sorted(snapshots.glob("snap-*/part-*"))[:1]
    data = bytearray(part.read_bytes())
    data[3] ^= 0x01
    part.write_bytes(bytes(data))
    (snapshots / "snap-000000000099").mkdir()  # an orphan: parts without a manifest
    # When it recovers
    store = await opened(tmp_path)
    # Then the damaged part is reported, everything is rebuilt from the log, orphans are gone
    assert any(str(part) in p for p in await store.check())
    assert not (snapshots / "snap-000000000099").exists()
    due = await store.fetch_due(NOW + 1000, limit=100, lease_ms=1000)
    assert [m.id for m in due] == [m.id for m in batch]
    await store.close()


async def test_cancel_and_reschedule_survive_a_restart(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    cancelled, moved = message(NOW + 10), message(NOW + 20)
    await store.store([cancelled, moved])
    await store.cancel(cancelled.id, now_ms=NOW)
    await store.reschedule(moved.id, deliver_at_ms=NOW + 3 * G, now_ms=NOW)
    await crash(store)
    store = await opened(tmp_path)
    assert (await store.get(cancelled.id)).state is MessageState.CANCELLED
    got = await store.get(moved.id)
    assert got is not None and got.deliver_at_ms == NOW + 3 * G
    assert await store.fetch_due(NOW + G, limit=10, lease_ms=10) == []
    [due] = await store.fetch_due(NOW + 3 * G, limit=10, lease_ms=10)
    assert due.id == moved.id
    assert await store.check() == []
    await store.close()


@pytest.mark.parametrize("how", ["crash", "closed"])
async def test_a_failed_message_waits_out_its_back_off_across_a_restart(
    tmp_path: Path, how: str
) -> None:
    # Given a message whose delivery failed, to be tried again 5 s later, and no snapshot since
    # (a snapshot indexes a held message at its retry time; the log has only the FAILED marker)
    store = await opened(tmp_path, snapshot_interval_ms=10**15)
    m = message(NOW + 10)
    await store.store([m])
    await store.fetch_due(NOW + 10, limit=1, lease_ms=30_000)
    assert await store.record_failure(m.id, error="refused", retry_at_ms=NOW + 5_000) == 1
    # When the store restarts before then: from the log alone, or from the closing snapshot
    if how == "crash":
        await crash(store)
    else:
        await store.close()
    store = await opened(tmp_path)
    # Then it is not tried again before its retry time, and keeps its count and error
    assert await store.fetch_due(NOW + 4_999, limit=10, lease_ms=10) == []
    assert await store.next_due_time() == NOW + 5_000
    [again] = await store.fetch_due(NOW + 5_000, limit=10, lease_ms=10)
    assert (again.id, again.failures, again.last_error) == (m.id, 1, "refused")
    assert await store.check() == []
    await store.close()


async def test_a_message_arriving_for_a_released_partition_keeps_it_from_deletion(
    tmp_path: Path,
) -> None:
    from tarry.store.log.partition import PartitionState

    # Given a partition whose window is over and whose messages are all released
    store = await opened(tmp_path)
    first = message(NOW + 5)
    await store.store([first])
    [due] = await store.fetch_due(NOW + 10, limit=1, lease_ms=1000)
    await store.remove([due.id], state=MessageState.READY, now_ms=NOW + 10)
    await store.writer.drain()  # the deferred release marker written
    partition = store.partitions[Layout.level0((NOW + 5) // G)]
    end = partition.end_ms
    partition.settle(end)
    assert partition.state is PartitionState.RELEASED
    # When a message accepted just before the window ended arrives after it
    late = message(end - 1)
    await store.store([late])
    # Then the partition is sealed again, not deleted, and the message is released
    assert await store.delete_released(end + 1) == 0
    assert partition.state is PartitionState.SEALED
    [got] = await store.fetch_due(end + 1, limit=10, lease_ms=1000)
    assert got.id == late.id
    await store.close()


async def test_a_manifest_naming_a_missing_part_is_ignored_and_the_log_replayed(
    tmp_path: Path,
) -> None:
    # Given a snapshot whose manifest names a part that is gone
    store = await opened(tmp_path)
    batch = [message(NOW + 10 + i) for i in range(8)]
    await store.store(batch)
    await store.fetch_due(NOW, limit=1, lease_ms=1)
    await store.snapshot()
    await crash(store)
    [part] = sorted((tmp_path / "snapshots").glob("snap-*/part-*"))[:1]
    part.unlink()
    # When the store recovers
    store = await opened(tmp_path)
    # Then the missing part is reported, no snapshot is used, and every message is there
    assert any("missing" in p and str(part) in p for p in await store.check())
    assert store.state.manifest is None
    due = await store.fetch_due(NOW + 1000, limit=100, lease_ms=1000)
    assert [m.id for m in due] == [m.id for m in batch]
    await store.close()


async def test_a_rescheduled_message_is_found_by_id_after_its_first_partition_is_deleted(
    tmp_path: Path,
) -> None:

    # Given a message moved out of its partition, whose partition is then drained and deleted
    store = await opened(tmp_path)
    moved, other = message(NOW + 5), message(NOW + 6)
    await store.store([moved, other])
    await store.reschedule(moved.id, deliver_at_ms=NOW + 10 * G, now_ms=NOW)
    due = await store.fetch_due(NOW + 10, limit=10, lease_ms=1000)
    await store.remove([m.id for m in due], state=MessageState.READY, now_ms=NOW + 10)
    assert await store.delete_released(NOW + G + 1) == 1
    # When it is looked up by id, now and after a crash (the MOVED marker went with its partition)
    found_now = await store.get(moved.id)
    await crash(store)
    store = await opened(tmp_path)
    found_after = await store.get(moved.id)
    # Then it is found each time, due at its new time
    assert found_now is not None and found_now.deliver_at_ms == NOW + 10 * G
    assert found_after is not None and found_after.deliver_at_ms == NOW + 10 * G
    assert await store.check() == []
    await store.close()


async def test_a_segment_shorter_than_its_snapshot_says_takes_appends_at_its_real_end(
    tmp_path: Path,
) -> None:
    # Given a snapshot naming a release marker's bytes, and a power loss that took them (the
    # marker was written without an fsync)
    store = await opened(tmp_path)
    first, second = message(NOW + 5), message(NOW + 6)
    await store.store([first, second])
    due = await store.fetch_due(NOW + 5, limit=1, lease_ms=1000)
    await store.remove([m.id for m in due], state=MessageState.READY, now_ms=NOW + 5)
    # (The marker needs no fsync: remove() returns before the writer has it, and the writer
    # keeps partition bytes in memory until a read needs them. Both first, so the checkpoint
    # names the marker's bytes in the file and the cut below falls into the marker.)
    while not store.writer.idle:
        await asyncio.sleep(0.001)
    await store.get(second.id)
    await store.snapshot()
    await crash(store)
    [segment] = segments(tmp_path)
    segment.write_bytes(segment.read_bytes()[: -len(b"x")])  # any cut into the marker
    # When the store recovers and accepts a message into that partition
    store = await opened(tmp_path)
    late = message(NOW + 7)
    await store.store([late])
    # Then that message is served from where it was written, with the others
    got = await store.fetch_due(NOW + 10, limit=10, lease_ms=1000)
    assert late.id in {m.id for m in got}
    assert await store.check() == []
    await store.close()


async def test_a_rescheduled_message_keeps_its_message_id_after_its_first_partition_is_deleted(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    # Given a message sent with a message_id, moved out of its partition, which is then drained
    # and deleted, and a crash
    store = await opened(tmp_path)
    moved = replace(message(NOW + 5), message_id="order-1")
    await store.store([moved, message(NOW + 6)])
    await store.reschedule(moved.id, deliver_at_ms=NOW + 10 * G, now_ms=NOW)
    due = await store.fetch_due(NOW + 10, limit=10, lease_ms=1000)
    await store.remove([m.id for m in due], state=MessageState.READY, now_ms=NOW + 10)
    assert await store.delete_released(NOW + G + 1) == 1
    retry = replace(moved, id=ids.new_due(NOW, NOW + 5))
    [before] = await store.store([retry])
    await crash(store)
    store = await opened(tmp_path)
    # When the producer sends it again
    [after] = await store.store([retry])
    # Then the message kept is returned each time, not a second one
    assert (before.created, before.message.id) == (False, moved.id)
    assert (after.created, after.message.id) == (False, moved.id)
    assert await store.check() == []
    await store.close()


async def test_a_failure_the_log_ends_with_a_release_is_forgotten_on_recovery(
    tmp_path: Path,
) -> None:
    # Given two messages that each failed once, one of them then delivered (its RELEASED
    # marker after its FAILED one in the log), and no snapshot since
    store = await opened(tmp_path, snapshot_interval_ms=10**15)
    done, pending = message(NOW + 10), message(NOW + 10)
    await store.store([done, pending])
    await store.fetch_due(NOW + 10, limit=2, lease_ms=30_000)
    for m in (done, pending):
        assert await store.record_failure(m.id, error="refused", retry_at_ms=NOW + 100) == 1
    [first, second] = await store.fetch_due(NOW + 100, limit=2, lease_ms=30_000)
    assert {first.id, second.id} == {done.id, pending.id}
    assert await store.remove([done.id], state=MessageState.DELIVERED, now_ms=NOW + 100) == 1
    await store.writer.drain()
    # When it restarts from the log alone
    await crash(store)
    store = await opened(tmp_path)
    # Then only the pending one's failure is remembered
    assert list(store.state.failures) == [pending.id]
    assert store.state.failures[pending.id].attempts == 1
    assert await store.check() == []
    await store.close()
