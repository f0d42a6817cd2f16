"""The clean-close record: lets a restart trust the last manifest's partition headers without a
``stat`` per partition.

A snapshot's manifest already holds every partition's segment sizes (the catalog), but a crash
can leave bytes past them, so recovery checks each partition's files (``recovery._unchanged``):
one or two ``stat`` calls each, ~200,000 for a year of 5-minute partitions, most of the restart
on a cold cache. ``close`` writes ``CLEAN`` after its final snapshot when nothing was appended
since that snapshot's capture, and after ``syncfs`` (so every byte the manifest names is on disk,
under any fsync policy). ``take`` reads and deletes it, durably, before the store accepts a
write: a crash afterwards finds no record and recovery checks every partition as before.

Trusted only when it names the manifest recovery loaded and as many partitions with bytes in it
as were found on disk; a missing, damaged or stale record costs nothing but the checks. What it
cannot see is a file changed behind the store's back between a clean close and the next start
(an append from an older tarry, a partial restore): ``tarry store verify`` reads every file.

File layout: ``MAGIC`` (8 bytes) · version:u32 · crc32c:u32 of the body · body (JSON)
``{"seq", "partitions"}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import orjson

from tarry.store.log.fs import Files
from tarry.store.log.manifest import ManifestError, frame, unframe, write_last

__all__ = ["CLEAN", "CleanClose", "mark", "take"]

log = logging.getLogger(__name__)

CLEAN = "CLEAN"
_MAGIC = b"TARRYCL1"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class CleanClose:
    #: The manifest written by the closing snapshot.
    seq: int
    #: Partitions with bytes in that manifest (found on disk again at a trusted start).
    partitions: int

    def matches(self, seq: int | None, partitions: int) -> bool:
        return seq == self.seq and partitions == self.partitions


def mark(root: Path, record: CleanClose, *, fs: Files) -> None:
    """Record a clean close (after the closing snapshot, with nothing written since)."""
    fs.sync_filesystem(root)
    body = orjson.dumps({"seq": record.seq, "partitions": record.partitions})
    write_last(root / CLEAN, frame(body, magic=_MAGIC, version=_VERSION), fs=fs)


def take(root: Path, *, fs: Files) -> CleanClose | None:
    """The clean-close record, if any, deleted durably first: trusted by this start only."""
    path = root / CLEAN
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    fs.unlink(path)
    fs.fsync_dir(root)
    try:
        fields = orjson.loads(unframe(data, magic=_MAGIC, version=_VERSION))
        return CleanClose(seq=int(fields["seq"]), partitions=int(fields["partitions"]))
    except (ManifestError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring a damaged clean-close record %s (%s)", path, exc)
        return None
