"""The log store under a simulated power loss at every crash point of a scripted workload
(``crashfs.py``): sends due soon and far ahead (up to a year), cancels, reschedules, releases
into the queue database (recorded there first, as ``tarry.engine.release`` does; their markers
deferred, written alone or with a later group: ``GroupWriter.defer``) and deliveries, each a
group commit of the write-ahead log (rolled over to new WAL segments), a checkpoint, cleanup of
a released partition (with its checkpoint, which deletes WAL segments), and a clean close. At
each boundary between two file changes, in both modes (nothing unsynced survives; a random
prefix of it does), a fresh ``LogStore`` recovers what the disk would hold and must show:

- no acknowledged message lost (acknowledged: its call returned; under ``fsync = batch`` that
  means fsynced), with the body it was sent with, and a producer's retry of one sent with a
  ``message_id`` is recognised (not kept twice);
- none delivered early (before its acknowledged due time, a reschedule's included);
- none released twice (a delivered or cancelled message never comes back; a message the queue
  database holds may come back, where the release is a no-op, but only once);
- no damaged record served (damage is reported, never returned as a message).

``TARRY_CRASH_SEEDS`` (default 2) runs more random prefixes per crash point.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.layout import Layout
from tarry.store.log.writer import LINGER_MS
from tests.store.crashfs import CrashFiles, Mode

NOW = 1_700_000_000_000
G = 60_000
DAY = 86_400_000
SEEDS = int(os.environ.get("TARRY_CRASH_SEEDS", "2"))
ids = IdGenerator()


def message(due_ms: int, n: int) -> Message:
    return Message(
        id=ids.new_due(NOW, due_ms),
        destination="q" if n % 3 else "r",
        body=f"body {n} ".encode() * (1 + n % 5),
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due_ms,
        expires_at_ms=None,
        message_id=f"m-{n}" if n % 2 else None,
        updated_at_ms=NOW,
    )


def open_store(root: Path, fs: CrashFiles | None = None, *, fsync: str = "batch") -> LogStore:
    # Small segments: groups roll over to new segment files (and new directory entries), and
    # the write-ahead log to new segments that checkpoints delete.
    return LogStore(
        root,
        granularity_ms=G,
        segment_bytes=2048,
        wal_segment_bytes=1024,
        commit_interval_ms=0,
        snapshot_interval_ms=10 * DAY,
        fsync=fsync,
        fs=fs,
    )


async def shut(store: LogStore) -> None:
    """Stop without a snapshot or a clean-close record (the power is gone)."""
    if store._scrubbing is not None:
        store._scrubbing.cancel()
        await asyncio.gather(store._scrubbing, return_exceptions=True)
    store._opened = False
    store.files.close()
    store._executor.shutdown(wait=True)
    store._scrub_pool.shutdown(wait=True)


@dataclass
class Workload:
    """What the workload sent, and (as marks in the trace) what each call acknowledged."""

    sent: dict[str, Message] = field(default_factory=dict)
    #: Reschedules tried: id -> new due (acknowledged when its mark is in the trace).
    moves: dict[str, int] = field(default_factory=dict)


async def run_workload(
    fs: CrashFiles,
    root: Path,
    *,
    fsync: str = "batch",
    linger_ms: int = LINGER_MS,
    syncfs_at: int | None = None,
) -> Workload:
    w = Workload()
    store = open_store(root, fs, fsync=fsync)
    store.writer.linger_ms = linger_ms
    store.files.syncfs_at = syncfs_at  # None: every checkpoint fsyncs file by file
    await store.open()

    async def send(dues: list[int]) -> list[Message]:
        batch = [message(due, len(w.sent) + i) for i, due in enumerate(dues)]
        w.sent.update((m.id, m) for m in batch)
        await store.store(batch)
        fs.mark(("sent", [m.id for m in batch]))
        return batch

    async def release(now_ms: int, *, delivered: bool) -> list[Message]:
        due = await store.fetch_due(now_ms, limit=100, lease_ms=60_000)
        got = [m.id for m in due]
        if delivered:  # an HTTP or RabbitMQ delivery: the marker is durable before the ack
            fs.mark(("finishing", got))
            await store.remove(got, state=MessageState.DELIVERED, now_ms=now_ms)
            fs.mark(("delivered", got))
        else:  # into a local queue: the queue database holds it first (durably)
            fs.mark(("queued", got))
            await store.remove(got, state=MessageState.READY, now_ms=now_ms)
        return due

    near = await send([NOW + 1_000 + 7_000 * i for i in range(6)])  # partition NOW // G
    far = await send([NOW + 30 * DAY + 1_000 * i for i in range(3)])
    # Spread over a year: one group commit (one WAL write and fsync) for partitions of
    # several levels (``layout.py``).
    await send([NOW + (10 + 35 * i) * DAY + i * 7_000 for i in range(10)])
    await send([NOW + 2 * G + 500 * i for i in range(5)])
    fs.mark(("finishing", [near[1].id]))
    await store.cancel(near[1].id, now_ms=NOW)
    fs.mark(("cancelled", [near[1].id]))
    for moved, to in ((far[0], NOW + 3 * G + 10), (near[2], NOW + 40 * DAY)):
        w.moves[moved.id] = to
        fs.mark(("moving", [moved.id]))
        await store.reschedule(moved.id, deliver_at_ms=to, now_ms=NOW)
        fs.mark(("moved", [moved.id]))
    await release(NOW + 20_000, delivered=False)
    await store.snapshot()
    await send([NOW + 2 * G + 9_000, NOW + 5 * DAY])
    # Moved after the snapshot, out of the partition cleanup deletes below.
    w.moves[near[5].id] = NOW + 3 * G + 5
    fs.mark(("moving", [near[5].id]))
    await store.reschedule(near[5].id, deliver_at_ms=NOW + 3 * G + 5, now_ms=NOW)
    fs.mark(("moved", [near[5].id]))
    await release(NOW + G, delivered=True)
    await release(NOW + 2 * G + 1_500, delivered=False)
    # Its markers are written alone once the linger is over (``linger_ms`` 0), or go with the
    # next send's group
    await asyncio.sleep(0.01)
    await send([NOW + 4 * G + 7])
    # The first partition is over and drained: cleanup deletes it (the queue database's
    # releases are durable already here: no barrier needed).
    assert await store.delete_released(NOW + 2 * G + 1_500) == 1
    await send([NOW + 3 * G + 1, NOW + 3 * G + 2])
    await release(NOW + 2 * G + G // 2, delivered=True)
    await store.close()
    return w


def acknowledged(fs: CrashFiles, point: int) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {
        k: set()
        for k in ("sent", "queued", "finishing", "delivered", "cancelled", "moving", "moved")
    }
    for note in fs.marks_before(point):
        assert isinstance(note, tuple)
        kind, noted = note
        out[kind].update(noted)
    return out


async def check_recovery(
    fs: CrashFiles,
    w: Workload,
    point: int,
    target: Path,
    mode: Mode,
    seed: int,
    *,
    during_reschedule: bool,
) -> None:
    """Recover what a power loss at ``point`` leaves and check every promise. A crash
    ``during_reschedule`` (under way, not acknowledged) is checked only when asked: today's
    store does not keep it (see ``test_a_power_loss_during_a_reschedule_...``)."""
    where = f"crash point {point} of {len(fs.ops)} ({mode}, seed {seed})"
    fs.disk_after(point, target, mode=mode, seed=seed)
    acked = acknowledged(fs, point)
    store = open_store(target / "log")
    await store.open()
    try:
        finished = acked["delivered"] | acked["cancelled"]
        # A delivery or cancel under way (not acknowledged) may or may not have happened.
        must_have = acked["sent"] - acked["finishing"] - acked["queued"]
        moving = acked["moving"] - acked["moved"]
        if not during_reschedule:
            must_have -= moving
        # No acknowledged message lost: each is found by id with its body.
        for message_id in sorted(must_have):
            got = await store.get(message_id)
            assert got is not None, f"{where}: acknowledged {message_id} lost"
            sent = w.sent[message_id]
            assert (got.body, got.destination) == (sent.body, sent.destination), where
            dues = {sent.deliver_at_ms, w.moves.get(message_id, sent.deliver_at_ms)}
            if message_id in acked["moved"]:
                dues = {w.moves[message_id]}
            assert got.deliver_at_ms in dues, f"{where}: {message_id} due {got.deliver_at_ms}"
            if sent.message_id is not None:  # sent again (a producer's retry): not kept twice
                again = replace(sent, id=ids.new_due(NOW, sent.deliver_at_ms))
                [outcome] = await store.store([again])
                assert not outcome.created, f"{where}: {message_id} kept twice"
                assert outcome.message.id == message_id, where
        # A message acknowledged after the restart, into a partition that holds records
        # already, is kept where its position says (appends continue at the real end).
        after = message(NOW + 2 * G + 100, 99)
        await store.store([after])
        all_sent = {**w.sent, after.id: after}
        must_have.add(after.id)
        # Everything falls due in order; none early, none twice, nothing garbled.
        times = sorted({m.deliver_at_ms for m in all_sent.values()} | set(w.moves.values()))
        released: dict[str, int] = {}
        for now_ms in times:
            for got in await store.fetch_due(now_ms, limit=1000, lease_ms=DAY * 365):
                was = all_sent.get(got.id)
                assert was is not None, f"{where}: served {got.id}, never sent"
                assert (got.body, got.destination) == (was.body, was.destination), where
                assert got.id not in finished, f"{where}: {got.id} finished, yet served again"
                if got.id in acked["moved"]:
                    assert got.deliver_at_ms == w.moves[got.id], f"{where}: {got.id} old copy"
                assert got.deliver_at_ms <= now_ms, f"{where}: {got.id} early"
                released[got.id] = released.get(got.id, 0) + 1
        twice = sorted(i for i, n in released.items() if n > 1)
        if not during_reschedule:
            twice = [i for i in twice if i not in moving]
        assert not twice, f"{where}: served twice: {twice}"
        missing = must_have - set(released)
        assert not missing, f"{where}: acknowledged, never due: {sorted(missing)}"
        if mode == "drop":  # only fsynced bytes, each record whole: nothing to report
            assert await store.check() == [], where
    finally:
        await shut(store)


async def crash_everywhere(
    tmp_path: Path,
    mode: Mode,
    *,
    during_reschedule: bool,
    fsync: str = "batch",
    linger_ms: int = LINGER_MS,
    syncfs_at: int | None = None,
) -> None:
    # Given the scripted workload, recorded change by change
    base = tmp_path / "live"
    base.mkdir()
    fs = CrashFiles(base)
    w = await run_workload(fs, base / "log", fsync=fsync, linger_ms=linger_ms, syncfs_at=syncfs_at)
    points = fs.crash_points()
    assert len(points) > 100  # the workload reached every step
    if during_reschedule:
        points = [p for p in points if acknowledged(fs, p)["moving"] - acknowledged(fs, p)["moved"]]
    # When the power fails at each boundary, then recovery keeps every promise
    for point in points:
        for seed in range(SEEDS if mode == "prefix" else 1):
            target = tmp_path / f"crash-{point}-{seed}"
            target.mkdir()
            await check_recovery(
                fs, w, point, target, mode, seed, during_reschedule=during_reschedule
            )


@pytest.mark.parametrize(
    ("mode", "fsync", "linger_ms"),
    [
        ("drop", "batch", LINGER_MS),
        ("prefix", "batch", LINGER_MS),
        ("drop", "always", LINGER_MS),
        # Release markers written alone as soon as the writer is free (no linger; with one,
        # the workload's send takes them along)
        ("drop", "batch", 0),
        ("prefix", "batch", 0),
    ],
)
async def test_a_power_loss_at_every_crash_point_loses_no_acknowledged_message(
    tmp_path: Path, mode: Mode, fsync: str, linger_ms: int
) -> None:
    await crash_everywhere(
        tmp_path, mode, during_reschedule=False, fsync=fsync, linger_ms=linger_ms
    )


@pytest.mark.parametrize("mode", ["drop", "prefix"])
async def test_a_power_loss_with_checkpoints_that_sync_the_file_system_at_once(
    tmp_path: Path, mode: Mode
) -> None:
    # Checkpoints make their partitions durable with one sync of the file system (as after a
    # burst over a year) instead of an fsync a file and a directory
    await crash_everywhere(tmp_path, mode, during_reschedule=False, syncfs_at=1)


async def test_a_power_loss_during_a_reschedule_keeps_the_message_once(tmp_path: Path) -> None:
    await crash_everywhere(tmp_path, "drop", during_reschedule=True)


async def test_a_snapshot_fsyncs_the_markers_it_names(tmp_path: Path) -> None:
    # Given a release marker written without an fsync (its message is in the queue database)
    base = tmp_path / "live"
    base.mkdir()
    fs = CrashFiles(base)
    store = open_store(base / "log", fs)
    await store.open()
    await store.store([message(NOW + 5, 1), message(NOW + 6, 2)])
    due = await store.fetch_due(NOW + 5, limit=1, lease_ms=1000)
    await store.remove([m.id for m in due], state=MessageState.READY, now_ms=NOW + 5)
    # (remove() returns before the writer has the marker, and the writer keeps partition
    # bytes in memory until a read needs them: both first, so the snapshot names the marker)
    while not store.writer.idle:
        await asyncio.sleep(0.001)
    await store.get(due[0].id)
    # When a snapshot is written (after the upkeep's, which the fetch may have begun), and the
    # power fails right after it
    assert await store._checkpoint() is not None
    sizes = {n: p.written for n, p in store.partitions.items()}
    await shut(store)
    target = tmp_path / "after"
    target.mkdir()
    fs.disk_after(len(fs.ops), target, mode="drop")
    # Then the disk holds every byte the snapshot recorded
    on_disk: dict[int, list[int]] = {}
    for path in sorted((target / "log" / "parts").glob("p-*.seg-*.log")):
        found = Layout.parse_segment(path.name)
        assert found is not None
        on_disk.setdefault(found[0], []).append(path.stat().st_size)
    assert on_disk == sizes
