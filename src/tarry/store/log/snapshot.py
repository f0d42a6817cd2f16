"""Index snapshots, written in parts of ``PART_BYTES`` (5 MB; the last of a blob shorter) under
``<root>/snapshots/snap-<seq>/part-<n>``; each part is fsynced, then the directory, and only
then the manifest (``manifest.py``) that names them with their CRC32C. A snapshot without a
manifest is incomplete: recovery ignores it and the orphan sweep deletes it.

What is stored: for every indexed partition its (due, position) arrays; the de-duplication
keys (hash, id) of pending messages. Everything else (counts, failures) is in the manifest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from tarry.store.log.fs import Files
from tarry.store.log.index import I64, sort_entries
from tarry.store.log.manifest import Manifest

if TYPE_CHECKING:
    from tarry.store.log.recovery import Recovered
    from tarry.store.log.table import PartitionTable

__all__ = ["PART_BYTES", "KeysAsOf", "SnapshotError", "capture", "read_blob", "write_snapshot"]

PART_BYTES = 5 * 1024 * 1024


class SnapshotError(Exception):
    """Raised when a part named by a manifest is missing or damaged."""


def _write_blob(
    directory: Path, manifest: Manifest, arrays: Sequence[np.ndarray[Any, Any]], fs: Files
) -> list[int]:
    """``arrays``' bytes one after another, in parts of ``PART_BYTES`` (the last one shorter;
    read back as one blob, ``read_blob``), each part joined from the arrays' slices as it is
    written. Never one copy of them all: a C call holds the GIL, and so the event loop,
    throughout, and a fresh copy of 30 MB of keys took 30-60 ms, most of it faulting in the
    copy's new pages."""
    first = len(manifest.parts)
    pending: list[memoryview] = []
    size = 0
    for array in arrays:
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        start = 0
        while start < len(flat):
            piece = flat[start : start + PART_BYTES - size]
            pending.append(piece.data)
            size += len(piece)
            start += len(piece)
            if size == PART_BYTES:
                _write_part(directory, manifest, b"".join(pending), fs)
                pending, size = [], 0
    if pending or len(manifest.parts) == first:  # the rest; or nothing to store: one empty part
        _write_part(directory, manifest, b"".join(pending), fs)
    return [first, len(manifest.parts) - first]


def _write_part(directory: Path, manifest: Manifest, chunk: bytes, fs: Files) -> None:
    name = f"part-{len(manifest.parts):06d}"
    fs.write_file(directory / name, chunk, what="checkpoint")
    manifest.parts.append({"name": name, "bytes": len(chunk), "crc": google_crc32c.value(chunk)})


def write_snapshot(
    root: Path,
    manifest: Manifest,
    indexes: dict[int, tuple[I64, I64]],
    keys: KeysAsOf,
    *,
    fs: Files,
) -> Path:
    """Parts first, the manifest last; returns the manifest's path. Each index is stored
    sorted by due, and the de-duplication keys as arrays (``capture`` leaves both to here, a
    thread of its own)."""
    directory = root / f"snap-{manifest.seq:012d}"
    fs.mkdir(directory)
    for number, entries in indexes.items():
        due, pos = sort_entries(*entries)
        manifest.indexed[str(number)] = [
            *_write_blob(directory, manifest, (due, pos), fs),
            len(due),
        ]
    hashes, ids = keys.chunks()
    count = sum(map(len, hashes))
    manifest.dedupe = [*_write_blob(directory, manifest, [*hashes, *ids], fs), count]
    fs.fsync_dir(directory)
    return manifest.write(root, fs=fs)


@dataclass(frozen=True, slots=True)
class KeysAsOf:
    """The de-duplication keys a snapshot holds, as its capture found them: each list of keys
    (``filed`` under a partition, ``unfiled``, ``refiling``) to the length it had. The lists
    only grow between two cleanups, and each key of ``dedupe`` is in one of them, so reading
    them later, on the checkpoint's thread, finds every key kept at the capture. What changed
    since is harmless: a key dropped since is dead, one pointing at a newer message since is
    replayed from the write-ahead log after the snapshot anyway. Copying the dict instead
    held the event loop, every minute, as long as there were keys to copy."""

    dedupe: dict[int, str]
    lists: list[tuple[list[int], int]]

    @classmethod
    def capture(cls, state: Recovered) -> KeysAsOf:
        everywhere = [*state.filed.values(), state.unfiled, *state.refiling]
        return cls(state.dedupe, [(keys, len(keys)) for keys in everywhere if keys])

    def chunks(self) -> tuple[list[I64], list[np.ndarray[Any, Any]]]:
        """The keys' hashes and ids, in slices of the same lengths, each read by C calls on a
        slice: each call holds the GIL throughout, and the event loop waits for it meanwhile,
        so none works on all of them."""
        hashes: list[I64] = []
        ids: list[np.ndarray[Any, Any]] = []
        for keys, length in self.lists:
            for first in range(0, length, _KEYS_A_SLICE):
                some = keys[first : min(first + _KEYS_A_SLICE, length)]
                found = list(map(self.dedupe.get, some, itertools.repeat("")))
                try:
                    named = np.array(found, "S26")
                except UnicodeEncodeError:  # not tarry's ids
                    named = np.array([i.encode() for i in found], "S26")
                kept = named != b""  # dropped since the capture
                hashes.append(np.array(some, np.int64)[kept])
                ids.append(named[kept])
        return hashes, ids


#: Keys ``KeysAsOf.chunks`` reads in one go.
_KEYS_A_SLICE = 16_384


def read_blob(root: Path, manifest: Manifest, first: int, count: int) -> bytes:
    """The bytes of parts ``first .. first+count``, each checked against its CRC."""
    directory = root / f"snap-{manifest.seq:012d}"
    chunks = []
    for part in manifest.parts[first : first + count]:
        path = directory / part["name"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"snapshot part {path} is missing") from None
        if len(data) != part["bytes"] or google_crc32c.value(data) != part["crc"]:
            raise SnapshotError(f"snapshot part {path} is damaged (checksum mismatch)")
        chunks.append(data)
    return b"".join(chunks)


def index_arrays(blob: bytes, entries: int) -> tuple[I64, I64]:
    both = np.frombuffer(blob, dtype=np.int64).reshape(2, entries)
    return both[0].copy(), both[1].copy()


def dedupe_arrays(blob: bytes, entries: int) -> tuple[I64, np.ndarray[Any, Any]]:
    hashes = np.frombuffer(blob[: 8 * entries], dtype=np.int64)
    ids = np.frombuffer(blob[8 * entries :], dtype="S26")
    return hashes, ids


def capture(
    table: PartitionTable, seq: int
) -> tuple[Manifest, dict[int, tuple[I64, I64]], KeysAsOf]:
    """What snapshot ``seq`` of ``store`` holds, taken in one event-loop step (no await), so
    the sizes it records agree with the in-memory state (``writer.py``): every partition's
    header, and for indexed ones the index plus the messages held outside it (claimed, waiting
    to retry, or leaving until their marker is written), not sorted yet, and where to find the
    de-duplication keys (``KeysAsOf``): ``write_snapshot`` sorts and reads them off the event
    loop (every minute, every key kept)."""
    manifest = Manifest(seq=seq, created_ms=table.now_ms)
    held_by: dict[int, list[Any]] = {}
    for held in table.held():
        held_by.setdefault(held.number, []).append(held)
    indexes = {}
    for number, partition in table.partitions.items():
        manifest.partitions[str(number)] = {
            "sizes": list(partition.written),
            "total": partition.total,
            "finished": partition.finished,
        }
        if partition.index is not None:
            due, pos = partition.index.entries()
            extra = held_by.get(number, [])
            if extra:
                due = np.concatenate((due, np.array([h.due for h in extra], np.int64)))
                pos = np.concatenate((pos, np.array([h.pos for h in extra], np.int64)))
            indexes[number] = (due, pos)
    state = table.state
    manifest.scheduled = {k: v for k, v in state.scheduled.items() if v > 0}
    manifest.failures = {k: list(v) for k, v in state.failures.items()}
    manifest.forwards = dict(state.forwards)
    return manifest, indexes, KeysAsOf.capture(state)
