"""Checkpoints: what makes the partitions' files durable behind the write-ahead log (``wal.py``).

A checkpoint captures, in one event-loop step, the partition table (sizes written, indexes,
where the de-duplication keys are, counts, failures, forwards) and the WAL position after the
last group that state includes. Then, on the writer thread (after every group the capture saw):

1. fsync every partition segment written since the last checkpoint, and the directories that
   gained entries (``SegmentFiles.sync_dirty``): one by one when they are few, with one sync of
   the file system when they are many (after a burst over a year);
2. write the snapshot's parts and, last, its manifest naming the WAL position (temp file, fsync,
   rename, fsync the directory: ``manifest.py``);
3. delete the WAL segments before that position (the capture began a new segment, so the next
   checkpoint deletes the one this covers: the WAL on disk stays bounded by the interval).

Recovery loads the newest manifest and replays the WAL from its position, so a restart reads
what was written since the last checkpoint, however many partitions or messages there are.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tarry.store.log.figures import SnapshotTimes
from tarry.store.log.recovery import snapshot_root, sweep_orphans
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.snapshot import capture, write_snapshot
from tarry.store.log.table import PartitionTable
from tarry.store.log.writer import GroupWriter

__all__ = ["Checkpoints"]


class Checkpoints:
    def __init__(
        self,
        root: Path,
        *,
        table: PartitionTable,
        files: SegmentFiles,
        writer: GroupWriter,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.root = root
        self.table = table
        self.files = files
        self.writer = writer
        self.executor = executor
        #: The sequence number of the last manifest (new ones number past every one on disk).
        self.seq = 0
        self.times = SnapshotTimes()
        #: WAL segments deleted so far.
        self.wal_segments_deleted = 0
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    async def take(self) -> Path | None:
        """Write a checkpoint; its manifest's path, or None while another is being written."""
        if self._running:
            return None
        self._running = True
        started = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
            # A new WAL segment first (between two groups, on the writer thread): every group
            # before it has had its ``on_written`` when this resumes, so the capture below
            # covers them, and the next checkpoint can delete the segment they are in.
            rolled = await loop.run_in_executor(self.executor, self.writer.wal.roll)
            if rolled is not None and self.writer.wal_end < rolled:
                self.writer.wal_end = rolled
            self.seq += 1
            manifest, indexes, keys = capture(self.table, self.seq)
            end = self.writer.wal_end
            manifest.wal = [end.seq, end.offset]

            def write() -> Path:
                # Everything the capture names is on disk before the manifest says so: markers
                # and groups behind the WAL were appended to the partitions without an fsync.
                self.writer.sync_dirty(self.root)
                path = write_snapshot(
                    snapshot_root(self.root), manifest, indexes, keys, fs=self.files.fs
                )
                self.wal_segments_deleted += self.writer.wal.drop_before(end.seq)
                # Here, not on the event loop: unlinking a superseded snapshot frees its blocks,
                # which takes as long as it is large (millions of keys kept make it large).
                sweep_orphans(self.root, manifest.seq, fs=self.files.fs)
                return path

            path = await loop.run_in_executor(self.executor, write)
            self.times.observe(time.perf_counter() - started)
            return path
        finally:
            self._running = False
