"""The manifest: the commit record of one checkpoint (a snapshot and the write-ahead log position
it covers), written last (temp file, fsync, rename, fsync the directory). Recovery trusts only
what a valid manifest names, and replays the WAL from ``wal`` (``[seq, offset]``).

File layout: ``MAGIC`` (8 bytes) · version:u32 · crc32c:u32 of the body · body (JSON):
``{"seq", "created_ms", "parts": [{"name", "bytes", "crc"}], "partitions": {number:
{"sizes", "total", "finished"}}, "indexed": {number: [first_part, part_count, entries]},
"dedupe": [first_part, part_count, entries], "scheduled": {destination: n}, "failures": {id:
[count, error, retry_at_ms]}, "forwards": {id: due_ms}, "wal": [seq, offset]}`` (a failure of
two items, from an older tarry, retries at once). Version 1 (before the WAL and ``layout.py``)
named partitions by ``due // granularity``; it is read with those numbers turned into keys.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import orjson

from tarry.store.log.fs import Files
from tarry.store.log.layout import Layout

__all__ = [
    "MAGIC",
    "Manifest",
    "ManifestError",
    "frame",
    "framed_version",
    "unframe",
    "write_last",
]

MAGIC = b"TARRYMF1"
VERSION = 2
#: Written before the WAL (partitions numbered ``due // granularity``): still read.
LEGACY_VERSION = 1
_HEAD = struct.Struct("<8sII")


class ManifestError(ValueError):
    """Raised when a manifest file is not a valid, complete manifest of this version."""


def frame(body: bytes, *, magic: bytes, version: int) -> bytes:
    """``magic`` · version · CRC32C of ``body`` · ``body``: how every commit record is laid out
    (the snapshot manifest here, an import area's ``IMPORT`` in ``adopt.py``)."""
    return _HEAD.pack(magic, version, google_crc32c.value(body)) + body


def unframe(data: bytes, *, magic: bytes, version: int) -> bytes:
    """The body of a framed record. Checks magic, then version, then checksum; raises
    ``ManifestError`` naming the first that fails."""
    if len(data) < _HEAD.size or data[:8] != magic:
        raise ManifestError("bad magic")
    _, found, crc = _HEAD.unpack_from(data)
    if found != version:
        raise ManifestError(f"version {found} (this tarry reads {version})")
    body = data[_HEAD.size :]
    if google_crc32c.value(body) != crc:
        raise ManifestError("checksum mismatch")
    return body


def framed_version(data: bytes, default: int) -> int:
    """The version a framed record's header states (``default`` when it is too short to say:
    ``unframe`` then names what is wrong)."""
    return int(_HEAD.unpack_from(data)[1]) if len(data) >= _HEAD.size else default


def write_last(final: Path, data: bytes, *, fs: Files) -> Path:
    """Write a commit record so that it is either whole or absent after a crash: temp file,
    fsync, rename, fsync the directory."""
    temp = final.with_name(final.name + ".tmp")
    fs.write_file(temp, data, what="checkpoint")
    fs.rename(temp, final)
    fs.fsync_dir(final.parent)
    return final


@dataclass
class Manifest:
    seq: int
    created_ms: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    indexed: dict[str, list[int]] = field(default_factory=dict)
    dedupe: list[int] = field(default_factory=lambda: [0, 0, 0])
    scheduled: dict[str, int] = field(default_factory=dict)
    failures: dict[str, list[Any]] = field(default_factory=dict)
    forwards: dict[str, int] = field(default_factory=dict)
    #: The WAL position this checkpoint covers: replay starts there.
    wal: list[int] = field(default_factory=lambda: [0, 0])

    def encode(self) -> bytes:
        return frame(orjson.dumps(self.__dict__), magic=MAGIC, version=VERSION)

    @classmethod
    def validate(cls, data: bytes) -> Manifest:
        """Check magic, then version, then checksum; raises ``ManifestError`` naming the first
        that fails."""
        legacy = framed_version(data, VERSION) == LEGACY_VERSION
        version = LEGACY_VERSION if legacy else VERSION
        manifest = cls(**orjson.loads(unframe(data, magic=MAGIC, version=version)))
        if legacy:
            manifest.partitions = {
                str(Layout.level0(int(n))): v for n, v in manifest.partitions.items()
            }
            manifest.indexed = {str(Layout.level0(int(n))): v for n, v in manifest.indexed.items()}
        return manifest

    def write(self, directory: Path, *, fs: Files) -> Path:
        return write_last(directory / f"manifest-{self.seq:012d}", self.encode(), fs=fs)
