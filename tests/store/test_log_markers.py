"""Release markers deferred (``GroupWriter.defer``): a release into a local queue (which the
queue database holds first) makes no group commit of its own; its marker goes with the next
group a caller waits for, in position order, or alone (no fsync) after the linger. Crash points
of both ways are in ``test_log_crash_points.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.wal import WalPosition, read_tail
from tests.store.crashfs import CrashFiles
from tests.store.test_log_batch import _FailingOnce
from tests.store.test_log_crash_points import shut

NOW = 1_700_000_000_000
G = 60_000
ids = IdGenerator()


def message(due_ms: int) -> Message:
    return Message(
        id=ids.new_due(NOW, due_ms),
        destination="q",
        body=b"x" * 50,
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due_ms,
        expires_at_ms=None,
        message_id=None,
        updated_at_ms=NOW,
    )


async def released_one(store: LogStore) -> tuple[Message, Message]:
    """Two messages stored; the first fetched and released into a local queue."""
    first, second = message(NOW + 5), message(NOW + 10_000)
    await store.store([first, second])
    [due] = await store.fetch_due(NOW + 5, limit=10, lease_ms=1_000)
    assert due.id == first.id
    if store._upkeeping is not None:  # the first fetch's cleanup and checkpoint, done first
        await store._upkeeping
    await store.remove([first.id], state=MessageState.READY, now_ms=NOW + 5)
    return first, second


async def until_idle(store: LogStore) -> None:
    for _ in range(2_000):
        if store.writer.idle:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the writer never went idle")


async def test_a_release_marker_goes_with_the_next_send_in_one_group_and_one_fsync(
    tmp_path: Path,
) -> None:
    # Given a store that keeps markers waiting (a long linger), a message released into a queue
    base = tmp_path / "live"
    base.mkdir()
    fs = CrashFiles(base)
    store = LogStore(base / "log", granularity_ms=G, fs=fs)
    await store.open()
    store.writer.linger_ms = 60_000
    first, second = await released_one(store)
    groups, fsyncs, ops = store.writer.groups, dict(fs.fsyncs), len(fs.ops)
    # Then the release made no group, no write, and is no longer counted as scheduled
    assert store.writer.groups == groups and len(fs.ops) == ops
    assert await store.count_scheduled() == 1 and await store.count_scheduled("q") == 1
    # When a producer's send comes
    third = message(NOW + 20_000)
    await store.store([third])
    # Then both are one group: one WAL write, one fsync, the marker ahead of the new record
    assert store.writer.groups == groups + 1
    made = {k: v - fsyncs.get(k, 0) for k, v in fs.fsyncs.items() if v != fsyncs.get(k, 0)}
    assert made == {"wal": 1}
    writes = [op for op in fs.ops[ops:] if op.kind == "write"]
    assert len(writes) == 1 and writes[0].path is not None and writes[0].path.parent.name == "wal"
    tail = list(read_tail(base / "log", WalPosition(0, 0), fs=None, report=print))
    assert first.id.encode() in tail[-2][2] and third.id.encode() in tail[-1][2]
    assert await store.count_scheduled() == 2
    await shut(store)
    # And a power loss right after it keeps the marker (fsynced with the send): the released
    # message is not served again, the others are
    target = tmp_path / "after"
    target.mkdir()
    fs.disk_after(len(fs.ops), target, mode="drop")
    again = LogStore(target / "log", granularity_ms=G)
    await again.open()
    due = await again.fetch_due(NOW + 30_000, limit=10, lease_ms=1_000)
    assert sorted(m.id for m in due) == sorted([second.id, third.id])
    await again.close()


async def test_release_markers_alone_are_written_after_the_linger_without_an_fsync(
    tmp_path: Path,
) -> None:
    # Given a short linger and a message released into a queue, nothing else written
    fs = CrashFiles(tmp_path)
    store = LogStore(tmp_path / "log", granularity_ms=G, fs=fs)
    await store.open()
    store.writer.linger_ms = 20
    first, _ = await released_one(store)
    groups, fsyncs = store.writer.groups, dict(fs.fsyncs)
    # When the linger passes
    await until_idle(store)
    # Then the marker was written as a group of its own, without an fsync
    assert store.writer.groups == groups + 1
    assert fs.fsyncs == fsyncs
    assert first.id not in store.table.leaving and not store.table.deferred["q"]
    # And a restart after a kill -9 (files as written) does not serve it again
    await shut(store)
    store = LogStore(tmp_path / "log", granularity_ms=G)
    await store.open()
    assert [m.id for m in await store.fetch_due(NOW + 5, limit=10, lease_ms=1)] == []
    await store.close()


async def test_a_failed_deferred_marker_puts_its_message_back_due_again(tmp_path: Path) -> None:
    # Given a message released into a queue whose marker's write fails (a full disk)
    fs = _FailingOnce()
    store = LogStore(tmp_path, granularity_ms=G, fs=fs)
    await store.open()
    store.writer.linger_ms = 10
    first, _ = await released_one(store)
    fs.fail = True
    await until_idle(store)
    # Then the message waits again, due at once, counted as scheduled (its release is retried,
    # a no-op in the queue database, and its marker written then)
    assert first.id not in store.table.leaving and not store.table.deferred["q"]
    assert await store.count_scheduled() == 2
    [due] = await store.fetch_due(NOW + 6, limit=10, lease_ms=1_000)
    assert due.id == first.id
    await store.remove([first.id], state=MessageState.READY, now_ms=NOW + 6)
    await store.writer.drain()
    assert await store.count_scheduled() == 1
    await store.close()
    # And the store reopens sound, the message released once
    store = LogStore(tmp_path, granularity_ms=G)
    await store.open()
    assert await store.check() == []
    assert await store.fetch_due(NOW + 6, limit=10, lease_ms=1) == []
    await store.close()


async def test_a_close_writes_the_markers_still_waiting(tmp_path: Path) -> None:
    # Given a released message whose marker waits (a long linger)
    store = LogStore(tmp_path, granularity_ms=G)
    await store.open()
    store.writer.linger_ms = 60_000
    first, second = await released_one(store)
    # When the store closes and opens again
    await store.close()
    store = LogStore(tmp_path, granularity_ms=G)
    await store.open()
    # Then the marker was written: only the other message is pending
    assert store.clean_start
    assert [m.id for m in await store.fetch_due(NOW + 20_000, limit=10, lease_ms=1)] == [second.id]
    await store.close()
