"""Segment files: appends held in memory behind the write-ahead log and written in the
background (``flush``: when ``FLUSH_BYTES`` are held, before any read of the partition, and by
each checkpoint, which then fsyncs them), and positional reads.

Durability policies (``[store] fsync``):

- ``batch`` (default): writes arriving within ``commit_interval_ms`` share one write and one
  fsync of the write-ahead log (``wal.py``); a producer's 201 waits for that fsync.
- ``always``: every group is fsynced at once, without waiting to gather more.
- ``never``: written to the operating system before the 201, never fsynced by the write path
  (a process crash loses nothing; a power loss may lose the last seconds).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from tarry.model.message import Message
from tarry.store.log.fs import SYNCFS_REPORTS_ERRORS, Files, OsFiles
from tarry.store.log.partition import OFFSET_MASK, SEGMENT_SHIFT, Partition, position, split
from tarry.store.log.record import (
    HEADER,
    MAX_RECORD,
    SHORT,
    PlainColumns,
    PlainReader,
    Record,
    decode_plain_columns,
    decode_records,
    parse_record,
)

__all__ = ["FLUSH_BYTES", "SYNCFS_FILES", "SegmentFiles"]

log = logging.getLogger(__name__)

T = TypeVar("T")


#: Appends held in memory past this many bytes are written out by the writer thread.
FLUSH_BYTES = 8 * 1024 * 1024
#: A checkpoint that has this many files and directories to fsync or more makes them durable
#: with one ``syncfs`` instead: each fsync waits for its own journal commit and disk-cache flush
#: (a checkpoint after a burst over a year has some 130-170 files),
#: while a ``syncfs`` is one, plus whatever else of the file system is unwritten (so a few files
#: are fsynced one by one). Only where a ``syncfs`` reports failed write-backs.
SYNCFS_FILES = 32
#: Most descriptors kept open per kind (write / read); the least recently used are closed.
MAX_OPEN = 256
#: A segment file held in memory: (partition key, segment number).
_File = tuple[int, int]
_Chunk = bytes | memoryview


class SegmentFiles:
    """Descriptors of segment files, bounded (``MAX_OPEN`` per kind, least recently used closed
    first). Appends are held in memory (``write``) and written by ``flush`` (any thread, under
    the lock); reads map the files from any thread, after flushing their partition. New files,
    directories and appended bytes are made durable by a checkpoint (``sync_dirty``)."""

    def __init__(self, fs: Files | None = None) -> None:
        #: Every change to a file goes through ``fs`` (``fs.py``); reads map the files directly.
        self.fs: Files = fs if fs is not None else OsFiles()
        self._write: OrderedDict[Path, int] = OrderedDict()
        self._read: OrderedDict[Path, mmap.mmap] = OrderedDict()
        self._new_dirs: set[Path] = set()
        #: Segments written since their last fsync (markers are appended without one).
        self._dirty: set[Path] = set()
        #: Appends not written yet, by file (in order), with their partitions. A file is named
        #: here by (partition key, segment), which hashes in C: a group over a year holds to some
        #: 100–190 files, and a ``Path`` would hash in Python. Each file's appends are kept as
        #: they came (read-only slices of a batch's bytes, not copied) and written with one
        #: ``writev``: growing a buffer per file by each group's slice cost more than the rest
        #: of ``hold``, and joining them would copy every byte once more.
        self._pending: dict[_File, list[_Chunk]] = {}
        self._owners: dict[_File, Partition] = {}
        #: The files of ``_pending`` by partition key (a read flushes its partition's alone).
        self._files_of: dict[int, list[_File]] = {}
        self.pending_bytes = 0
        #: ``sync_dirty`` syncs the file system at this many fsyncs (None: never).
        self.syncfs_at: int | None = SYNCFS_FILES if SYNCFS_REPORTS_ERRORS else None
        self._lock = threading.RLock()

    def write(self, partition: Partition, segment: int, data: bytes) -> None:
        """Append ``data`` to a segment: held in memory until the next ``flush``."""
        self.hold([(partition, position(segment, 0), data)])

    def hold(self, writes: Sequence[tuple[Partition, int, bytes | memoryview]]) -> None:
        """Append each (partition, position, data) to the partition's segment of ``position``
        (its offset is where the data lands: appends come in order): held in memory until the
        next ``flush``, under one lock for a group commit's writes."""
        pending, added = self._pending, 0
        with self._lock:
            for partition, pos, data in writes:
                if not isinstance(data, bytes) and not data.readonly:
                    data = bytes(data)  # a view of a buffer that may change: copied
                file = (partition.number, pos >> SEGMENT_SHIFT)
                held = pending.get(file)
                if held is None:
                    pending[file] = [data]
                    self._owners[file] = partition
                    self._files_of.setdefault(partition.number, []).append(file)
                else:
                    held.append(data)
                added += len(data)
            self.pending_bytes += added

    def flush(self, partition: Partition | None = None) -> None:
        """Write out what is held for ``partition`` (every partition: None), one ``writev`` per
        file. Raises ``OSError`` as the writes do; what failed stays held, its file cut back."""
        with self._lock:
            if not self._pending:
                return
            if partition is None:
                files = list(self._pending)
            else:
                files = list(self._files_of.get(partition.number, ()))
                if not files:
                    return
            for file in files:
                self._flush_one(file)
            self.trim()

    def _forget(self, file: _File) -> None:
        del self._owners[file], self._pending[file]
        files = self._files_of[file[0]]
        files.remove(file)
        if not files:
            del self._files_of[file[0]]

    def _flush_quietly(self, partition: Partition) -> None:
        """``flush`` before a read, its failure left to the read: a fetch flushed the bytes it
        reads already (what failed now is a later group's, which the WAL holds)."""
        try:
            self.flush(partition)
        except OSError as exc:
            log.warning("cannot write partition %d behind the WAL yet: %s", partition.number, exc)

    def _flush_one(self, file: _File) -> None:
        partition = self._owners[file]
        path = partition.segment_path(file[1])
        fd = self._write.get(path)
        if fd is None:
            fd = self._write[path] = self._open(partition, path)
        self._write.move_to_end(path)
        chunks = self._pending[file]
        before = os.fstat(fd).st_size
        try:
            self.fs.writev(fd, chunks)
        except OSError:
            self.fs.truncate(fd, before)  # no partial record before the next try
            raise
        self._forget(file)
        self.pending_bytes -= sum(map(len, chunks))
        self._dirty.add(path)

    def _open(self, partition: Partition, path: Path) -> int:
        """A write descriptor for one of ``partition``'s segments, created when new: one inode,
        in the directory every partition's files share (made at the store's start), which the
        next checkpoint fsyncs."""
        try:
            fd = self.fs.open_append(path)
        except FileNotFoundError:  # its directory deleted behind this process's back: made again
            self.fs.mkdir(path.parent)
            self._new_dirs.add(path.parent.parent)
            fd = self.fs.open_append(path)
        self._new_dirs.add(path.parent)
        return fd

    def cut(self, lengths: dict[Path, int]) -> None:
        """Truncate each file to its length (what a failed group left past it), durably, and
        forget its read map (it may span the bytes cut). Missing files have nothing to cut."""
        for path, length in lengths.items():
            with self._lock:
                view = self._read.pop(path, None)
                if view is not None:
                    view.close()
            try:
                fd = self.fs.open_existing(path)
            except FileNotFoundError:
                continue
            try:
                self.fs.truncate(fd, length)
                self.fs.fsync(fd, what="partition")
            finally:
                self.fs.close(fd)
            self._dirty.discard(path)

    def trim(self) -> None:
        """Close the least recently used write descriptors past ``MAX_OPEN`` (what was written
        through them is in ``_dirty`` until a checkpoint fsyncs it)."""
        while len(self._write) > MAX_OPEN:
            _, fd = self._write.popitem(last=False)
            self.fs.close(fd)

    def sync_dirty(self, root: Path | None = None) -> None:
        """Flush, then fsync every segment written since its last fsync, open or not (a
        checkpoint must not name bytes the disk may not have), and the directories that gained
        entries; or, when that is ``syncfs_at`` fsyncs or more, one ``sync_filesystem`` of
        ``root``'s file system instead. What a read flushes meanwhile (another thread) is left
        for the next call; what this call fails to sync is too."""
        with self._lock:
            self.flush()
            dirty, self._dirty = self._dirty, set()
            new_dirs, self._new_dirs = self._new_dirs, set()
        try:
            needed = len(dirty) + len(new_dirs)
            if root is not None and self.syncfs_at is not None and needed >= self.syncfs_at:
                self.fs.sync_filesystem(root)
                return
            for path in sorted(dirty):
                self._sync_file(path)
            for directory in sorted(new_dirs, key=lambda d: len(d.parts)):
                self.fs.fsync_dir(directory)
        except BaseException:
            with self._lock:
                self._dirty |= dirty
                self._new_dirs |= new_dirs
            raise

    def _sync_file(self, path: Path) -> None:
        # A descriptor of its own, outside the lock: a release round's ``flush`` takes the
        # lock on the event loop, and must not wait out a checkpoint's fsync behind it.
        try:  # gone with its partition when missing
            fd = self.fs.open_existing(path)
        except FileNotFoundError:
            return
        try:
            self.fs.fsync(fd, what="partition")
        finally:
            self.fs.close(fd)

    def close_partition(self, partition: Partition) -> None:
        with self._lock:
            for file in list(self._files_of.get(partition.number, ())):
                self.pending_bytes -= sum(map(len, self._pending[file]))
                self._forget(file)
            for path in [p for p in self._write if partition.owns(p)]:
                self.fs.close(self._write.pop(path))
            for path in [p for p in self._read if partition.owns(p)]:
                self._read.pop(path).close()

    def close(self) -> None:
        """Close every descriptor; what is held and not flushed is dropped (the write-ahead
        log has it)."""
        with self._lock:
            self._pending.clear()
            self._owners.clear()
            self._files_of.clear()
            self.pending_bytes = 0
            for fd in self._write.values():
                self.fs.close(fd)
            for view in self._read.values():
                view.close()
            self._write.clear()
            self._read.clear()

    def read(self, partition: Partition, pos: int) -> Record | str:
        """The record at ``pos`` (checked), or why it cannot be read. Segments are read through
        read-only memory maps (no system call per record), remapped when they have grown."""
        segment, offset = split(pos)
        path = partition.segment_path(segment)
        with self._lock:
            self._flush_quietly(partition)
            view = self._map(path, offset + HEADER)
            if view is None:
                return "missing segment"
            if len(view) >= offset + HEADER:
                end = offset + HEADER + int.from_bytes(view[offset + 4 : offset + 8], "little")
                if end <= offset + HEADER + MAX_RECORD and end > len(view):
                    view = self._map(path, end) or view
            return parse_record(view, offset)

    def read_records(
        self, partition: Partition, positions: list[int], plain: PlainReader[T]
    ) -> list[Message | T | str]:
        """The message at each position of one partition (a fetched batch), or why it cannot
        be read (``decode_records``; ``plain`` reads a record without flags), under one lock:
        one call per segment the batch touches. A record that runs past the memory map
        (appended since it was made) is read again from a fresh map of the whole file."""
        out: list[Message | T | str] = ["missing segment"] * len(positions)
        by_segment: dict[int, tuple[list[int], list[int]]] = {}
        for i, pos in enumerate(positions):
            indexes, offsets = by_segment.setdefault(pos >> SEGMENT_SHIFT, ([], []))
            indexes.append(i)
            offsets.append(pos & OFFSET_MASK)
        with self._lock:
            self._flush_quietly(partition)
            for segment, (indexes, offsets) in by_segment.items():
                path = partition.segment_path(segment)
                view = self._map(path, max(offsets) + HEADER)
                if view is None:
                    continue
                got = decode_records(view, offsets, plain)
                short = [k for k, g in enumerate(got) if type(g) is str and g in SHORT]
                if short:
                    view = self._map(path, len(view) + 1) or view
                    again = decode_records(view, [offsets[k] for k in short], plain)
                    for k, message in zip(short, again, strict=True):
                        got[k] = message
                for i, message in zip(indexes, got, strict=True):
                    out[i] = message
        return out

    def read_plain_columns(self, partition: Partition, positions: list[int]) -> PlainColumns | None:
        """The records at ``positions`` of one partition as columns (``decode_plain_columns``)
        when they lie in one segment and every one is a whole, valid, plain MESSAGE record;
        None otherwise (``read_records`` reads them and tells why)."""
        segment = min(positions) >> SEGMENT_SHIFT
        if max(positions) >> SEGMENT_SHIFT != segment:
            return None
        with self._lock:
            self._flush_quietly(partition)
            view = self._map(
                partition.segment_path(segment), (max(positions) & OFFSET_MASK) + HEADER
            )
            if view is None:
                return None
            return decode_plain_columns(view, segment << SEGMENT_SHIFT, positions)

    def _map(self, path: Path, need: int) -> mmap.mmap | None:
        view = self._read.get(path)
        if view is not None and len(view) >= need:
            self._read.move_to_end(path)
            return view
        if view is not None:
            view.close()
            del self._read[path]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return None
            view = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._read[path] = view
        while len(self._read) > MAX_OPEN:
            self._read.popitem(last=False)[1].close()
        return view
