"""Index snapshots, written in parts of at most ``PART_BYTES`` (5 MB) under
``<root>/snapshots/snap-<seq>/part-<n>``; each part is fsynced, then the directory, and only
then the manifest (``manifest.py``) that names them with their CRC32C. A snapshot without a
manifest is incomplete: recovery ignores it and the orphan sweep deletes it.

What is stored: for every indexed partition its (due, position) arrays; the de-duplication
keys (hash, id) of pending messages. Everything else (counts, failures) is in the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from tarry.store.log.fs import Files
from tarry.store.log.index import I64, sort_entries
from tarry.store.log.manifest import Manifest

if TYPE_CHECKING:
    from tarry.store.log.table import PartitionTable

__all__ = ["PART_BYTES", "SnapshotError", "capture", "read_blob", "write_snapshot"]

PART_BYTES = 5 * 1024 * 1024


class SnapshotError(Exception):
    """Raised when a part named by a manifest is missing or damaged."""


def _write_blob(directory: Path, manifest: Manifest, blob: bytes, fs: Files) -> list[int]:
    first = len(manifest.parts)
    for start in range(0, max(len(blob), 1), PART_BYTES):
        chunk = blob[start : start + PART_BYTES]
        name = f"part-{len(manifest.parts):06d}"
        fs.write_file(directory / name, chunk, what="checkpoint")
        manifest.parts.append(
            {"name": name, "bytes": len(chunk), "crc": google_crc32c.value(chunk)}
        )
    return [first, len(manifest.parts) - first]


def write_snapshot(
    root: Path,
    manifest: Manifest,
    indexes: dict[int, tuple[I64, I64]],
    dedupe: dict[int, str],
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
        blob = np.stack((due, pos)).tobytes()
        manifest.indexed[str(number)] = [*_write_blob(directory, manifest, blob, fs), len(due)]
    hashes, ids = _arrays_of_keys(dedupe)
    blob = hashes.tobytes() + ids.tobytes()
    manifest.dedupe = [*_write_blob(directory, manifest, blob, fs), len(hashes)]
    fs.fsync_dir(directory)
    return manifest.write(root, fs=fs)


def _arrays_of_keys(dedupe: dict[int, str]) -> tuple[I64, np.ndarray[Any, Any]]:
    """The keys' hashes and ids as arrays, made a slice at a time: a numpy call holds the GIL
    throughout, and the event loop waits for it meanwhile."""
    hashes, ids = list(dedupe), list(dedupe.values())
    step = 65_536
    return (
        np.concatenate(
            [np.array(hashes[i : i + step], np.int64) for i in range(0, len(hashes), step)]
            or [np.zeros(0, np.int64)]
        ),
        np.concatenate(
            [
                np.array([x.encode() for x in ids[i : i + step]], dtype="S26")
                for i in range(0, len(ids), step)
            ]
            or [np.zeros(0, dtype="S26")]
        ),
    )


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
) -> tuple[Manifest, dict[int, tuple[I64, I64]], dict[int, str]]:
    """What snapshot ``seq`` of ``store`` holds, taken in one event-loop step (no await), so
    the sizes it records agree with the in-memory state (``writer.py``): every partition's
    header, and for indexed ones the index plus the messages held outside it (claimed, waiting
    to retry, or leaving until their marker is written), not sorted yet, and a copy of the
    de-duplication keys: ``write_snapshot`` sorts and encodes them off the event loop (a
    Python call a key, every minute, for every key kept)."""
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
    return manifest, indexes, state.dedupe.copy()
