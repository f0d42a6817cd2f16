"""A time partition: the messages due in ``[start_ms, end_ms)``, in append-only segment files
``<root>/parts/<name>.seg-<n>.log`` (``segment.py``; names and coarser partitions far ahead:
``layout.py``; every partition's files in one directory: ``migrate.py`` says why),
with a small header kept in memory (counts, segment sizes) and, only while it is due, a
``DueIndex``. Appended behind the write-ahead log (``wal.py``), fsynced by checkpoints.

Lifecycle (one table, ``ALLOWED``): ``open`` (its window has not ended; new messages arrive) →
``sealed`` (the window is over; only markers are appended while the rest is released) →
``released`` (every message released or cancelled, no write in flight: cleanup may delete its
files). A message accepted just before the window ended can still arrive after it (the append
follows validation by a few ms): it moves a ``released`` partition back to ``sealed``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from tarry.store.log.index import DueIndex
from tarry.store.log.layout import Layout

__all__ = [
    "ALLOWED",
    "OFFSET_MASK",
    "PARTS",
    "SEGMENT_SHIFT",
    "Partition",
    "PartitionState",
    "mark_written",
    "parts_root",
    "position",
    "reserve",
    "split",
]

#: A position is ``segment << SEGMENT_SHIFT | offset`` (offsets up to 1 TiB per segment).
SEGMENT_SHIFT = 40
OFFSET_MASK = (1 << SEGMENT_SHIFT) - 1
#: The directory of every partition's segment files, under the store's root.
PARTS = "parts"


def parts_root(root: Path) -> Path:
    return root / PARTS


def position(segment: int, offset: int) -> int:
    return (segment << SEGMENT_SHIFT) | offset


def split(pos: int) -> tuple[int, int]:
    return pos >> SEGMENT_SHIFT, pos & OFFSET_MASK


class PartitionState(StrEnum):
    #: Its due window has not ended: messages are still appended.
    OPEN = "open"
    #: The window is over; markers are appended while its messages are released.
    SEALED = "sealed"
    #: Nothing pending is left: its files may be deleted.
    RELEASED = "released"


ALLOWED: dict[PartitionState, frozenset[PartitionState]] = {
    PartitionState.OPEN: frozenset({PartitionState.SEALED}),
    PartitionState.SEALED: frozenset({PartitionState.RELEASED, PartitionState.OPEN}),
    PartitionState.RELEASED: frozenset({PartitionState.SEALED}),
}


class Partition:
    def __init__(self, root: Path, number: int, layout: Layout, *, nested: bool = False) -> None:
        """Partition ``number`` of the store at ``root``; ``nested``: its files are where the
        layout before flat files kept them, ``<root>/<name>/seg-<n>.log`` (the read-only tools
        read such a store in place; the store itself moves them: ``migrate.py``)."""
        #: The partition's key (``layout.py``): sorts partitions by start.
        self.number = number
        self.start_ms, self.end_ms = layout.window(number)
        #: ``p<level>-<start // granularity>``: the prefix of its segment files' names.
        self.name = layout.name_of(number)
        if nested:
            self._base, self._prefix = root / self.name, "seg-"
        else:
            self._base, self._prefix = parts_root(root), f"{self.name}.seg-"
        #: Bytes reserved (written or being written) per segment, in order.
        self.sizes: list[int] = []
        #: Bytes whose write has completed, per segment (what a reader may scan).
        self.written: list[int] = []
        #: Bytes of each segment that recovery did not read (a snapshot covered them, or a
        #: clean close vouched for them): what the start-up scrub checks (``scrub.py``).
        self.unchecked: list[int] | None = None
        #: MESSAGE records held (a rescheduled copy counts in its new partition).
        self.total = 0
        #: Of those, released, cancelled or moved away.
        self.finished = 0
        self.index: DueIndex | None = None
        self._paths: list[Path] = []
        self.state = PartitionState.OPEN

    @property
    def live(self) -> int:
        return self.total - self.finished

    def move(self, target: PartitionState) -> None:
        if target is not self.state:
            if target not in ALLOWED[self.state]:
                raise ValueError(f"partition {self.number}: {self.state} -> {target}")
            self.state = target

    @property
    def writing(self) -> bool:
        """Bytes are reserved whose write has not completed (their messages are not counted
        yet)."""
        return self.sizes != self.written

    def settle(self, now_ms: int) -> None:
        """Move along the lifecycle as time, counts and writes in flight say."""
        if self.state is PartitionState.OPEN and now_ms >= self.end_ms:
            self.move(PartitionState.SEALED)
        busy = self.live > 0 or self.writing
        if self.state is PartitionState.SEALED and not busy:
            self.move(PartitionState.RELEASED)
        elif self.state is PartitionState.RELEASED and busy:
            self.move(PartitionState.SEALED)

    def segment_path(self, segment: int) -> Path:
        paths = self._paths
        while len(paths) <= segment:
            paths.append(self._base / f"{self._prefix}{len(paths):06d}.log")
        return paths[segment]

    def owns(self, path: Path) -> bool:
        """``path`` is one of this partition's segment files."""
        return path.parent == self._base and path.name.startswith(self._prefix)

    def on_disk(self) -> list[tuple[Path, int]]:
        """(path, size) of each segment file found, in order: segments are numbered from 0
        without a gap, so a ``stat`` each and one more (not a listing of a directory that holds
        every partition's files)."""
        found: list[tuple[Path, int]] = []
        while True:
            path = self.segment_path(len(found))
            try:
                found.append((path, os.stat(path).st_size))
            except FileNotFoundError:
                return found


def reserve(
    items: Sequence[tuple[Partition, bytes | memoryview]], segment_bytes: int
) -> list[tuple[Partition, int, bytes | memoryview]]:
    """(partition, position, data) of each (partition, data) appended now, in order: each
    partition's reserved size grows by its data (rolling to a new segment when the data would
    pass ``segment_bytes`` in a segment that holds some). One loop for a whole group's items
    (a batch due over a year has a run for each of some 100–190 partitions)."""
    out: list[tuple[Partition, int, bytes | memoryview]] = []
    append = out.append
    for partition, data in items:
        sizes, nbytes = partition.sizes, len(data)
        if not sizes or (sizes[-1] and sizes[-1] + nbytes > segment_bytes):
            sizes.append(0)
        segment = len(sizes) - 1
        offset = sizes[segment]
        sizes[segment] = offset + nbytes
        append((partition, segment << SEGMENT_SHIFT | offset, data))
    return out


def mark_written(writes: Sequence[tuple[Partition, int, bytes | memoryview]]) -> None:
    """Each partition's ``written`` size of a segment advanced past (position, data) written."""
    for partition, pos, data in writes:
        segment, stop = pos >> SEGMENT_SHIFT, (pos & OFFSET_MASK) + len(data)
        written = partition.written
        while len(written) <= segment:
            written.append(0)
        if written[segment] < stop:
            written[segment] = stop
