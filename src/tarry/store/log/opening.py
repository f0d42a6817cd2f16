"""Opening a log store directory: the latest checkpoint, then the write-ahead log's tail after it,
then the partitions' records past the checkpoint's sizes (``recovery.replay``), then adopting
finished offline imports (``adopt.py``; the store checkpoints after adopting: ``Opened.adopted``).

1. load the newest complete snapshot (``recovery.load_snapshot``): partition sizes and counts,
   indexes, de-duplication keys, failures, forwards, and the WAL position it covers;
2. replay the WAL from that position into the partitions' files (``wal.apply``): whatever an
   acknowledged group wrote that a power loss took from a partition's file is written again;
3. read each partition past its checkpointed sizes (counts, index, de-duplication keys).

A directory written before the WAL (partitions, perhaps a version-1 manifest, no ``wal/``) is
opened the same way (its WAL tail is empty; every record past its last snapshot is read from
the partitions, as that version's recovery did) and migrated: the store writes a checkpoint at
once, so that its manifest is of this version (``Opened.migrated``). A directory written with a
directory per partition has its segment files moved into ``parts/`` first (``migrate.py``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tarry.model.time import SystemClock
from tarry.store.log import clean
from tarry.store.log.adopt import adopt_imports
from tarry.store.log.cleanup import empty_trash, file_all
from tarry.store.log.layout import Layout
from tarry.store.log.migrate import flatten
from tarry.store.log.partition import Partition, parts_root
from tarry.store.log.recovery import load_snapshot, replay, snapshot_root, sweep_orphans
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable
from tarry.store.log.wal import WalPosition, apply, read_tail, segments, wal_root

__all__ = ["Opened", "recover"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Opened:
    #: The newest manifest's number on disk, usable or not (new ones number past it).
    seq: int
    #: The start trusted a clean-close record (``clean.py``): no partition checked.
    clean_start: bool
    #: WAL entries the partitions' files lacked and got back.
    wal_rewritten: int
    #: The directory was written before the WAL: write a checkpoint now.
    migrated: bool
    #: Records adopted from offline imports: write a checkpoint now, so that the next start
    #: finds them in it rather than reading the adopted segments again.
    adopted: int
    #: The WAL segment the store writes next.
    next_wal_seq: int
    seconds: float


def recover(
    root: Path, *, table: PartitionTable, files: SegmentFiles, now_ms: int | None = None
) -> Opened:
    """Open the store at ``root`` (the module docstring). ``now_ms``: the time the store opens
    at (None: the wall clock's), by which the partitions current then are indexed as they are
    read (``_current``)."""
    started = time.perf_counter()
    now_ms = SystemClock().now_ms() if now_ms is None else now_ms
    fs = files.fs
    state = table.state
    if not snapshot_root(root).is_dir():
        # A new store: its directories' entries are made durable before any write is
        # acknowledged, or a power loss could take the store's directory with everything.
        fs.mkdir(snapshot_root(root))
        fs.mkdir(wal_root(root))
        fs.mkdir(parts_root(root))
        fs.fsync_dir(root.parent)
        fs.fsync_dir(root)
    elif not parts_root(root).is_dir():  # written before the flat layout (``migrate.py``)
        fs.mkdir(parts_root(root))
        fs.fsync_dir(root)
    migrated = not wal_root(root).is_dir()
    if migrated:
        log.warning(
            "%s was written by a tarry before the write-ahead log: opening it and writing a "
            "checkpoint in this version's format (an older tarry cannot open it afterwards)",
            root,
        )
    flatten(root, fs=fs)
    with os.scandir(parts_root(root)) as entries:
        keys = sorted(
            {found[0] for e in entries if (found := Layout.parse_segment(e.name)) is not None}
        )
    for key in keys:  # in order: each insertion lands at the end
        table.partition(key)
    load_snapshot(root, table.partitions, state)
    manifest = state.manifest
    on_disk = [
        int(p.name.split("-", 1)[1])
        for p in snapshot_root(root).glob("manifest-*")
        if p.name.split("-", 1)[1].isdigit()
    ]
    sweep_orphans(root, manifest.seq if manifest else None, fs=fs)
    empty_trash(root, fs=fs)
    record = clean.take(root, fs=fs)
    start = WalPosition(*manifest.wal) if manifest else WalPosition(0, 0)
    rewritten = apply(
        read_tail(root, start, fs=fs, report=state.report),
        partition_of=table.partition,
        write=files.write,
        cut=lambda path, length: files.cut({path: length}),
        report=state.report,
    )
    files.flush()  # what the WAL gave back, on disk before the partitions are read
    trusted = (
        record is not None
        and not rewritten
        and record.matches(
            manifest.seq if manifest else None,
            sum(1 for p in table.partitions.values() if p.sizes),
        )
    )
    if record is not None and not trusted:
        log.info("clean-close record %s does not match the snapshot loaded; checking", record)
    for partition in table.partitions.values():
        replay(
            partition,
            state,
            build_index=partition.index is not None or _current(partition, table, now_ms),
            trusted=trusted,
            fs=fs,
        )
    adopted = adopt_imports(  # bulk imports (tarry pipeline import --into), all or nothing
        root, layout=table.layout, partition_of=table.partition, state=state, fs=fs
    )
    file_all(table)
    seconds = time.perf_counter() - started
    log.info(
        "log store recovered %d partitions (%d pending) in %.3f s: snapshot %s, WAL from %s "
        "(%d entries rewritten), %d records replayed, %s",
        len(table.partitions),
        sum(p.live for p in table.partitions.values()),
        seconds,
        manifest.seq if manifest else "none",
        f"{start.seq}:{start.offset}",
        rewritten,
        state.replayed_records,
        "after a clean close (files unchecked)" if trusted else "every partition checked",
    )
    return Opened(
        seq=max(on_disk, default=0),
        clean_start=trusted,
        wal_rewritten=rewritten,
        migrated=migrated,
        adopted=adopted,
        next_wal_seq=max(segments(wal_root(root)), default=0) + 1,
        seconds=seconds,
    )


def _current(partition: Partition, table: PartitionTable, now_ms: int) -> bool:
    """Whether ``partition`` is read whole by its replay (no snapshot covers any of it) and is
    current or within ``prefetch_ms`` by the wall clock: its index is built from that read,
    not from a second one once the store runs (``indexing.py``). Partitions already due in
    full wait for the rounds, a few at a time, as they do with a snapshot. The time only
    moves when an index is built, not what it holds."""
    return (
        not partition.sizes
        and partition.start_ms <= now_ms + table.prefetch_ms
        and partition.end_ms > now_ms
    )
