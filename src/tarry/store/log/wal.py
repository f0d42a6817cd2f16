"""The write-ahead log (WAL): every change the log store accepts is appended here first, one
record per group commit, so a group costs one ``write`` and one ``fsync`` however many time
partitions it touches (a bookie's journal). The partitions' segment files are written behind it
without an fsync; a checkpoint (``checkpoint.py``) fsyncs them and records the WAL position it
covers, and the WAL segments before that position are deleted. Not to be confused with tarry's
JSON-lines event journal.

On disk, ``<root>/wal/wal-<seq>.log``, a new segment past ``segment_bytes`` and at each start::

    segment := MAGIC (8 bytes, "TARRYWL1": format version 1) group*
    group   := length:u32 crc32c:u32 body                 (little endian; crc = CRC32C(body))
    body    := entry*
    entry   := partition:i64 position:i64 length:u32 data  (data: records appended to the
               partition's segment at ``position``, as ``record.py`` frames them)

A group is one record: after a power loss it is there whole or not at all (a torn group fails
its CRC and ends the log), so a reschedule's MOVED marker and its new copy, written to two
partitions, survive together or not at all. A position in the WAL is ``(seq, offset)``.

Replay (``read_tail`` then ``apply``) rewrites into the partitions' files whatever of the tail
they lack: an entry whose bytes a file holds already is skipped; a file that is shorter is
appended to; one whose bytes differ is cut back there first.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import google_crc32c

from tarry.store.log.fs import Files, FsyncWhat
from tarry.store.log.partition import Partition, split

__all__ = ["MAGIC", "WalLog", "WalPosition", "encode_group", "read_tail", "wal_root"]

log = logging.getLogger(__name__)

MAGIC = b"TARRYWL1"
_GROUP = struct.Struct("<II")
_ENTRY = struct.Struct("<qqI")
#: A group longer than this is damage, not a group.
_MAX_GROUP = 1 << 31


@dataclass(frozen=True, order=True, slots=True)
class WalPosition:
    """A place in the WAL: segment ``seq``, byte ``offset`` in it."""

    seq: int
    offset: int


def wal_root(root: Path) -> Path:
    return root / "wal"


def _segment_path(directory: Path, seq: int) -> Path:
    return directory / f"wal-{seq:012d}.log"


def segments(directory: Path) -> list[int]:
    """The sequence numbers of the WAL segments in ``directory``, in order."""
    if not directory.is_dir():
        return []
    return sorted(
        int(p.name[4:-4])
        for p in directory.iterdir()
        if p.name.startswith("wal-") and p.name.endswith(".log") and p.name[4:-4].isdigit()
    )


def encode_group(writes: Sequence[tuple[Partition, int, bytes | memoryview]]) -> bytes:
    """One group's WAL record: an entry for each (partition, position, data) written."""
    pack = _ENTRY.pack
    parts: list[bytes | memoryview] = []
    for partition, pos, data in writes:
        parts += (pack(partition.number, pos, len(data)), data)
    body = b"".join(parts)
    return _GROUP.pack(len(body), google_crc32c.value(body)) + body


class WalLog:
    """The WAL's writing end, used from the store's writer thread only."""

    def __init__(self, root: Path, fs: Files, *, segment_bytes: int) -> None:
        self.dir = wal_root(root)
        self.fs = fs
        self.segment_bytes = segment_bytes
        self.seq = 0
        self.size = 0
        self._fd: int | None = None
        #: A segment was created since the last sync: its directory entry needs an fsync too.
        self._new_entry = False
        #: Bytes appended (``/metrics``: ``tarry_store_wal_bytes_total``).
        self.bytes_written = 0

    @property
    def position(self) -> WalPosition:
        """Where the next group goes (everything before it is written)."""
        return WalPosition(self.seq, self.size)

    def start(self, seq: int) -> None:
        """Begin segment ``seq`` (at open, and at a checkpoint), made durable now: counted as
        ``wal_segment``, so that ``wal`` counts the group commits' fsyncs alone."""
        self._roll(seq)
        self._sync(what="wal_segment")

    def _roll(self, seq: int) -> None:
        if self._fd is not None:
            self.fs.close(self._fd)
        self.fs.mkdir(self.dir)
        self.seq, self._fd = seq, self.fs.open_append(_segment_path(self.dir, seq))
        self.fs.write(self._fd, MAGIC)
        self.size = len(MAGIC)
        self._new_entry = True

    def roll(self) -> WalPosition | None:
        """Begin a new segment now, when the current one holds groups (a checkpoint does, so
        that the segments it covers can be deleted: the WAL on disk stays bounded by the
        checkpoint interval); the new segment's start, or None."""
        if self._fd is None or self.size <= len(MAGIC):
            return None
        self.start(self.seq + 1)
        return self.position

    def append(self, group: bytes) -> None:
        if self._fd is None or (
            self.size > len(MAGIC) and self.size + len(group) > self.segment_bytes
        ):
            self._roll(self.seq + 1)
        assert self._fd is not None
        self.fs.write(self._fd, group)
        self.size += len(group)
        self.bytes_written += len(group)

    def sync(self) -> None:
        """The group commit's one fsync (and, after a new segment, its directory's)."""
        self._sync(what="wal")

    def _sync(self, *, what: FsyncWhat) -> None:
        if self._fd is None:
            return
        self.fs.fsync(self._fd, what=what)
        if self._new_entry:
            self.fs.fsync_dir(self.dir)
            self._new_entry = False

    def cut(self, size: int) -> None:
        """Cut the current segment back to ``size`` (a failed group's bytes, which a failed
        write may have left without counting them), durably."""
        if self._fd is not None:
            self.fs.truncate(self._fd, size)
            self.fs.fsync(self._fd, what="wal")
            self.size = size

    def drop_before(self, seq: int) -> int:
        """Delete the segments before ``seq`` (a checkpoint covers them); how many."""
        gone = [s for s in segments(self.dir) if s < seq]
        for old in gone:
            self.fs.unlink(_segment_path(self.dir, old))
        return len(gone)

    def close(self) -> None:
        if self._fd is not None:
            self.fs.close(self._fd)
            self._fd = None


def read_tail(
    root: Path, start: WalPosition, *, fs: Files | None, report: Callable[[str], object]
) -> Iterator[tuple[int, int, bytes]]:
    """Every (partition key, position, data) written at or after ``start``, in order. A group
    that fails its checks ends its segment: at the segment's end it is a torn tail (cut through
    ``fs``, when given), before a valid group it is damage (``report``ed)."""
    directory = wal_root(root)
    for seq in segments(directory):
        if seq < start.seq:
            continue
        path = _segment_path(directory, seq)
        data = path.read_bytes()
        if data[: len(MAGIC)] != MAGIC:
            if len(data) < len(MAGIC) and MAGIC.startswith(data):
                continue  # created, never written: a crash at a segment's start
            report(f"{path}: not a WAL segment of this version (bad magic)")
            continue
        offset = max(len(MAGIC), start.offset if seq == start.seq else 0)
        while offset < len(data):
            problem = _check_group(data, offset)
            if problem is not None:
                _torn_or_damaged(path, data, offset, problem, fs, report)
                break
            length = _GROUP.unpack_from(data, offset)[0]
            at, end = offset + _GROUP.size, offset + _GROUP.size + length
            while at < end:
                key, pos, size = _ENTRY.unpack_from(data, at)
                at += _ENTRY.size
                yield key, pos, data[at : at + size]
                at += size
            offset = end


def _check_group(data: bytes, offset: int) -> str | None:
    if len(data) - offset < _GROUP.size:
        return "short group header"
    length, crc = _GROUP.unpack_from(data, offset)
    if length > _MAX_GROUP or offset + _GROUP.size + length > len(data):
        return "short group"
    if google_crc32c.value(data[offset + _GROUP.size : offset + _GROUP.size + length]) != crc:
        return "checksum mismatch"
    return None


def _torn_or_damaged(
    path: Path,
    data: bytes,
    offset: int,
    problem: str,
    fs: Files | None,
    report: Callable[[str], object],
) -> None:
    follows = any(_check_group(data, at) is None for at in _group_starts(data, offset + 1))
    where = f"{path} at byte {offset}"
    if follows:
        log.error(
            "damaged WAL group in %s (%s); the rest of the segment is skipped", where, problem
        )
        report(f"{where}: {problem}")
    elif fs is not None:
        log.warning("cutting a torn tail off %s (%s)", where, problem)
        fs.truncate_path(path, offset)


def _group_starts(data: bytes, offset: int) -> Iterator[int]:
    """Offsets past ``offset`` where a group could start (a cheap walk: every byte, bounded)."""
    yield from range(offset, min(len(data), offset + 1_000_000))


def apply(
    entries: Iterator[tuple[int, int, bytes]],
    *,
    partition_of: Callable[[int], Partition],
    write: Callable[[Partition, int, bytes], object],
    cut: Callable[[Path, int], object],
    report: Callable[[str], object],
) -> int:
    """Make each partition's files hold what the WAL tail says (see the module docstring);
    returns how many entries had to be written."""
    written = 0
    sizes: dict[Path, int] = {}
    handles: dict[Path, BinaryIO] = {}
    try:
        for key, pos, data in entries:
            partition = partition_of(key)
            segment, offset = split(pos)
            path = partition.segment_path(segment)
            size = sizes.get(path)
            if size is None:
                try:
                    size = os.stat(path).st_size
                except FileNotFoundError:
                    size = 0
            if size > offset:
                handle = handles.get(path)
                if handle is None:
                    handle = handles[path] = open(path, "rb")  # noqa: SIM115 (closed below)
                handle.seek(offset)
                if handle.read(len(data)) == data:
                    sizes[path] = size
                    continue
                handles.pop(path).close()
                cut(path, offset)
                size = offset
            if size < offset:
                report(f"{path}: holds {size} bytes, but the WAL has a record for byte {offset}")
                sizes[path] = size
                continue
            write(partition, segment, data)
            sizes[path] = size + len(data)
            written += 1
    finally:
        for handle in handles.values():
            handle.close()
    return written
