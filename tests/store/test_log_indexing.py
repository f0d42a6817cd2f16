"""Indexing a partition ahead of its start (``tarry.store.log.indexing``): a partition that comes
within ``prefetch_ms`` is indexed in the background, a step at a time with the event loop free
in between, and whatever changes while it is read (new messages, cancels, moves in and out, the
partition falling due) ends up in the index exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore, indexing, reading
from tarry.store.log.indexing import IndexAhead, IndexBuild
from tarry.store.log.partition import Partition
from tests.store.test_log_reading import _flip_a_byte_of
from tests.store.test_log_recovery import NOW, G, message, opened

#: The partition the tests fill: past the horizon at ``NOW``, inside it at ``NEAR``.
START = (NOW // G + 5) * G
NEAR = START - G // 2
LEASE = 60_000


async def _filled(
    root: Path, count: int, segment_bytes: int = 64 * 1024 * 1024
) -> tuple[LogStore, list[Message], Partition]:
    """A store (``prefetch_ms`` one partition) holding ``count`` messages due in the first
    half of the partition at ``START``, not indexed."""
    store = await opened(root, prefetch_ms=G, segment_bytes=segment_bytes)
    sent = [message(START + k % (G // 2), b"m-%06d" % k) for k in range(count)]
    for at in range(0, count, 1000):
        await store.store(sent[at : at + 1000])
    assert await store.fetch_due(NOW, limit=10, lease_ms=LEASE) == []
    [partition] = [p for p in store.partitions.values() if p.start_ms == START]
    assert partition.end_ms == START + G
    assert partition.index is None
    return store, sent, partition


async def _built(store: LogStore, partition: Partition) -> int:
    """Let the background build run to its end; how many turns the event loop had meanwhile."""
    turns, deadline = 0, time.monotonic() + 30
    while partition.index is None:
        await asyncio.sleep(0)
        turns += 1
        assert time.monotonic() < deadline
    assert partition.number not in store.table.building
    return turns


async def _stepped(build: IndexBuild) -> None:
    """Wait until a held build (``_held_after_a_step``) has made its one step."""
    for _ in range(10_000):
        if build.steps:
            break
        await asyncio.sleep(0.001)
    assert build.steps == 1 and build.partition.index is None


async def _released(store: LogStore, until_ms: int) -> list[str]:
    """The ids every fetch up to ``until_ms`` hands out, in order, each acknowledged."""
    out: list[str] = []
    while due := await store.fetch_due(until_ms, limit=1000, lease_ms=LEASE):
        out += [m.id for m in due]
        await store.remove([m.id for m in due], state=MessageState.DELIVERED, now_ms=until_ms)
    return out


def _in_due_order(messages: list[Message]) -> list[str]:
    return [m.id for m in sorted(messages, key=lambda m: m.deliver_at_ms)]


async def test_a_partition_coming_near_is_indexed_in_steps_with_the_loop_free_between(
    tmp_path: Path,
) -> None:
    # Given 5,000 messages in a partition beyond the horizon
    store, sent, partition = await _filled(tmp_path, 5_000)
    try:
        # When a round looks once the partition is within prefetch_ms
        assert await store.fetch_due(NEAR, limit=10, lease_ms=LEASE) == []
        # Then the round did not index it: a build runs in the background, in several steps
        assert partition.index is None
        build = store.table.building[partition.number]
        turns = await _built(store, partition)
        assert build.steps >= 5 and turns >= 5
        assert len(partition.index or ()) == 5_000
        # And each message is released once, in due order, none early
        assert await store.fetch_due(START - 1, limit=10, lease_ms=LEASE) == []
        assert await _released(store, START + G) == _in_due_order(sent)
    finally:
        await store.close()


def _held_after_a_step(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Background builds wait after their first step until the event returned is set."""
    go_on = asyncio.Event()

    async def turn(_: IndexAhead) -> None:
        await go_on.wait()

    monkeypatch.setattr(IndexAhead, "_turn", turn)
    return go_on


async def test_changes_while_the_index_is_built_are_in_it_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a build under way (a step done) for a partition of 3,000 messages
    go_on = _held_after_a_step(monkeypatch)
    store, sent, partition = await _filled(tmp_path, 3_000)
    elsewhere = message(START + 2 * G, b"elsewhere")
    await store.store([elsewhere])
    try:
        await store.fetch_due(NEAR, limit=10, lease_ms=LEASE)
        build = store.table.building[partition.number]
        await _stepped(build)
        # When, meanwhile, a message is added, one already read is cancelled, one is moved
        # out and one moved in
        added = message(START + 7, b"added")
        await store.store([added])
        await store.cancel(sent[0].id, now_ms=NEAR)
        await store.reschedule(sent[1].id, deliver_at_ms=START + 3 * G, now_ms=NEAR)
        moved_in = await store.reschedule(elsewhere.id, deliver_at_ms=START + 9, now_ms=NEAR)
        assert build.steps == 1 and partition.index is None
        go_on.set()
        await _built(store, partition)
        # Then the index holds exactly the messages pending there, and each is released once
        expected = [*sent[2:], added, moved_in]
        assert len(partition.index or ()) == len(expected)
        assert await _released(store, START + G) == _in_due_order(expected)
        assert await _released(store, START + 3 * G) == [sent[1].id]
    finally:
        await store.close()


async def test_a_small_partition_falling_due_mid_build_is_finished_by_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a build under way of a partition of 3,000 records, fewer than a round indexes
    monkeypatch.setattr(reading, "SYNC_RECORDS", 5_000)
    go_on = _held_after_a_step(monkeypatch)
    store, sent, partition = await _filled(tmp_path, 3_000)
    try:
        await store.fetch_due(NEAR, limit=10, lease_ms=LEASE)
        await _stepped(store.table.building[partition.number])
        # When a round finds the partition due before the build is done
        first = await store.fetch_due(START + G, limit=3_000, lease_ms=LEASE)
        # Then that round finished the index itself: everything due, once, in due order
        assert [m.id for m in first] == _in_due_order(sent)
        assert partition.number not in store.table.building
        go_on.set()
        for _ in range(20):  # the background task stops without indexing again
            await asyncio.sleep(0)
        assert await store.fetch_due(START + G, limit=3_000, lease_ms=LEASE) == []
    finally:
        await store.close()


async def test_a_large_partition_due_before_it_is_indexed_is_built_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a partition of 3,000 records, more than a round indexes, not indexed when it
    # falls due (as after downtime), its build held after a step
    monkeypatch.setattr(reading, "SYNC_RECORDS", 2_000)
    go_on = _held_after_a_step(monkeypatch)
    store, sent, partition = await _filled(tmp_path, 3_000)
    try:
        # When rounds find it due
        assert await store.fetch_due(START + G, limit=3_000, lease_ms=LEASE) == []
        build = store.table.building[partition.number]
        await _stepped(build)
        # Then they leave it to the build, which the event loop runs between them
        assert await store.fetch_due(START + G, limit=3_000, lease_ms=LEASE) == []
        assert build.steps == 1
        go_on.set()
        await _built(store, partition)
        # And once it is built, everything is due, once, in due order
        assert await _released(store, START + G) == _in_due_order(sent)
    finally:
        await store.close()


async def test_the_next_due_time_waits_for_a_build_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    # Given a partition far ahead, not indexed, and nothing else pending
    store, sent, partition = await _filled(tmp_path, 5_000)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.get_running_loop().create_task(ticker())
    try:
        # When the dispatcher asks when the next message is due
        next_due = await store.next_due_time()
        # Then the answer is exact, and the loop ran other work while the index was built
        assert next_due == min(m.deliver_at_ms for m in sent)
        assert ticks >= 5
    finally:
        running.cancel()
        await store.close()


@pytest.mark.parametrize("damaged", [False, True])
async def test_records_cut_by_a_read_s_end_are_read_whole_and_damage_is_named_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: bool
) -> None:
    # Given reads of 4 KiB (a record's end is cut through by most of them) of segments of
    # 64 KiB, and optionally one record damaged in the middle of the partition
    monkeypatch.setattr(indexing, "CHUNK_BYTES", 4096)
    store, sent, partition = await _filled(tmp_path, 2_000, segment_bytes=64 * 1024)
    try:
        assert len(partition.written) > 3
        store.files.flush()
        if damaged:
            segment = _flip_a_byte_of(tmp_path, b"m-001000")
        # When it is built ahead
        await store.fetch_due(NEAR, limit=10, lease_ms=LEASE)
        build = store.table.building[partition.number]
        await _built(store, partition)
        # Then it was read 4 KiB at a time (a cut record read again from its start, not in
        # ever longer reads), every whole record indexed; the damaged one reported once
        assert build.reads >= sum(partition.written) // 4096
        expected = [m for m in sent if not (damaged and m.body == b"m-001000")]
        assert await _released(store, START + G) == _in_due_order(expected)
        if damaged:
            [line] = store.state.damaged
            assert str(segment) in line
        else:
            assert store.state.damaged == []
    finally:
        await store.close()


async def test_a_cancel_while_the_read_entries_are_sorted_is_not_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a build that read everything and sorts it on a thread, held there
    store, sent, partition = await _filled(tmp_path, 3_000)
    sorting, go_on = threading.Event(), threading.Event()
    sort_entries = indexing.sort_entries

    def held_sort(due: Any, pos: Any) -> Any:
        sorting.set()
        assert go_on.wait(10)
        return sort_entries(due, pos)

    monkeypatch.setattr(indexing, "sort_entries", held_sort)
    try:
        await store.fetch_due(NEAR, limit=10, lease_ms=LEASE)
        while not sorting.is_set():
            await asyncio.sleep(0.001)
        # When a message it read is cancelled meanwhile (its marker read after the sort began)
        await store.cancel(sent[5].id, now_ms=NEAR)
        go_on.set()
        await _built(store, partition)
        # Then the index leaves it out
        expected = [m for m in sent if m is not sent[5]]
        assert len(partition.index or ()) == len(expected)
        assert await _released(store, START + G) == _in_due_order(expected)
    finally:
        go_on.set()
        await store.close()


async def test_a_failed_build_is_not_begun_again_and_the_round_reads_it_when_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a partition whose background build fails (a read error, say)
    store, sent, partition = await _filled(tmp_path, 3_000)
    steps = 0

    def failing_step(self: IndexBuild, records: int = 500) -> bool:
        nonlocal steps
        steps += 1
        raise OSError("cannot read")

    monkeypatch.setattr(IndexBuild, "step", failing_step)
    try:
        await store.fetch_due(NEAR, limit=10, lease_ms=LEASE)
        for _ in range(10_000):  # its first step comes after a write-out on a thread
            if partition.number not in store.table.building:
                break
            await asyncio.sleep(0.001)
        assert steps == 1 and partition.number not in store.table.building
        assert "indexing partition" in caplog.text
        # When rounds look again before it is due: no build is begun again
        for _ in range(5):
            assert await store.fetch_due(NEAR, limit=10, lease_ms=LEASE) == []
            await asyncio.sleep(0)
        assert steps == 1 and partition.index is None
        # Then, once readable and due, the round reads it all at once and releases it
        monkeypatch.undo()
        assert await _released(store, START + G) == _in_due_order(sent)
    finally:
        await store.close()
