"""The write-ahead log and its checkpoints (``tarry.store.log.wal`` / ``checkpoint``): one fsync
per group commit however the due times are spread, a bounded number of partitions, WAL segments
deleted by checkpoints, and a restart that reads only what came after the last checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.store.log import LogStore
from tarry.store.log.wal import segments, wal_root
from tests.store.crashfs import CrashFiles
from tests.store.test_log_crash_points import shut

NOW = 1_700_000_000_000
G = 300_000
YEAR = 365 * 86_400_000
ids = IdGenerator()


def message(due_ms: int, n: int = 0) -> Message:
    return Message(
        id=ids.new_due(NOW, due_ms),
        destination="q",
        body=b"x" * 100,
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due_ms,
        expires_at_ms=None,
        message_id=f"m-{n}" if n % 2 else None,
        updated_at_ms=NOW,
    )


def spread(n: int, over_ms: int, seed: int = 1) -> list[Message]:
    rng = random.Random(seed)
    return [message(NOW + 1_000 + rng.randrange(over_ms), seed * n + i) for i in range(n)]


async def test_a_group_commit_costs_one_fsync_however_the_due_times_are_spread(
    tmp_path: Path,
) -> None:
    for name, over_ms in (("seconds", 9_000), ("year", YEAR)):
        # Given an open store counting its fsyncs and recording its writes
        (tmp_path / name).mkdir()
        fs = CrashFiles(tmp_path / name)
        store = LogStore(tmp_path / name / "log", granularity_ms=G, fs=fs)
        await store.open()
        before = dict(fs.fsyncs)
        ops = len(fs.ops)
        # When a batch of 1,000 due over 1-10 s, or over a year, is stored (one group)
        groups = store.writer.groups
        await store.store(spread(1_000, over_ms))
        # Then that group commit made exactly one fsync: the WAL's
        assert store.writer.groups == groups + 1
        made = {k: v - before.get(k, 0) for k, v in fs.fsyncs.items() if v != before.get(k, 0)}
        assert made == {"wal": 1}, (name, made)
        # And one write, the WAL's: the partitions' bytes are written behind it
        writes = [op.path for op in fs.ops[ops:] if op.kind == "write"]
        assert len(writes) == 1 and writes[0] is not None and writes[0].parent.name == "wal"
        await store.close()


async def test_the_partitions_of_a_year_of_due_times_stay_few(tmp_path: Path) -> None:
    # Given 5-minute partitions (a year of them would be 105,120)
    store = LogStore(tmp_path, granularity_ms=G)
    await store.open()
    # When 20,000 messages due over a year are stored
    for start in range(0, 20_000, 1_000):
        await store.store(spread(1_000, YEAR, seed=start // 1_000))
    # Then they take a few hundred partitions at most, coarser far ahead, each findable
    assert len(store.partitions) < 250, len(store.partitions)
    assert await store.count_scheduled() == 20_000
    near = message(NOW + 60_000)
    far = message(NOW + YEAR - 1)
    await store.store([near, far])
    assert (await store.get(far.id)) is not None and (await store.get(near.id)) is not None
    assert (
        store.partitions[store.layout.key_for(far.deliver_at_ms, NOW)].end_ms
        - store.partitions[store.layout.key_for(far.deliver_at_ms, NOW)].start_ms
        > 1000 * G
    )
    await store.close()


async def test_a_checkpoint_deletes_the_wal_before_it_and_a_restart_reads_only_the_tail(
    tmp_path: Path,
) -> None:
    # Given a store whose WAL rolls over every few groups, with groups written
    store = LogStore(tmp_path, granularity_ms=G, wal_segment_bytes=16_384)
    await store.open()
    for start in range(0, 2_000, 100):
        await store.store(spread(100, YEAR, seed=start // 100))
    assert len(segments(wal_root(tmp_path))) > 5
    # When a checkpoint is written
    await store.snapshot()
    # Then the WAL segments before its position are deleted
    assert segments(wal_root(tmp_path)) == [store.writer.wal.seq]
    # And after more changes and a kill -9, a restart replays only what followed it
    tail = spread(30, YEAR, seed=99)
    await store.store(tail)
    await store.cancel(tail[0].id, now_ms=NOW)
    await shut(store)  # kill -9: no closing checkpoint
    store = LogStore(tmp_path, granularity_ms=G, wal_segment_bytes=16_384)
    await store.open()
    assert store.state.replayed_records == len(tail) + 1
    assert await store.count_scheduled() == 2_000 + len(tail) - 1
    for message_id in [m.id for m in tail[1:]]:
        assert await store.get(message_id) is not None
    assert await store.check() == []
    await store.close()


async def test_a_kill_9_loses_nothing_that_only_the_wal_made_durable(tmp_path: Path) -> None:
    # Given messages acknowledged (their WAL group fsynced) and the partitions' files lost
    # since (what a power loss does to bytes written without an fsync)
    store = LogStore(tmp_path, granularity_ms=G)
    await store.open()
    await store.snapshot()
    sent = spread(500, YEAR, seed=7)
    await store.store(sent)
    await shut(store)  # kill -9: no closing checkpoint
    for segment in (tmp_path / "parts").glob("p*-*.seg-*.log"):
        segment.unlink()
    # When the store opens again
    store = LogStore(tmp_path, granularity_ms=G)
    await store.open()
    # Then the WAL's tail wrote them again: every message is there, none damaged
    assert await store.count_scheduled() == len(sent)
    for m in sent[:50]:
        got = await store.get(m.id)
        assert got is not None and got.body == m.body
    assert await store.check() == []
    await store.close()
