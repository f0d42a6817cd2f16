"""Read-only views of a log store directory for ``tarry store inspect`` and ``tarry store
verify``: nothing is cut, swept or rewritten (a running server may own the directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tarry.store.log.layout import Layout
from tarry.store.log.manifest import Manifest, ManifestError
from tarry.store.log.migrate import nested_partitions
from tarry.store.log.partition import Partition, parts_root
from tarry.store.log.record import Damage, Record, scan
from tarry.store.log.recovery import Recovered, load_snapshot, replay, snapshot_root
from tarry.store.log.snapshot import SnapshotError, read_blob
from tarry.store.log.wal import WalPosition, read_tail, segments, wal_root

__all__ = ["inspect", "log_root", "verify"]


def log_root(directory: Path) -> Path:
    """``directory`` itself, or its ``log`` subdirectory when given a data directory."""
    if (directory / "log").is_dir():
        return directory / "log"
    return directory


def _segment_files(root: Path) -> list[Path]:
    """Every segment file: in ``parts/``, and in partition directories of a store written
    before the flat layout and not opened since (read in place: ``migrate.py``)."""
    flat = sorted(parts_root(root).glob("p*-*.seg-*.log"))
    return flat + sorted(root.glob("p*-*/seg-*.log"))


def _partitions(root: Path, granularity_ms: int) -> dict[int, Partition]:
    layout = Layout(granularity_ms)
    partitions = {key: Partition(root, key, layout, nested=True) for key in nested_partitions(root)}
    flat_keys = {found[0] for p in _segment_files(root) if (found := Layout.parse_segment(p.name))}
    for key in flat_keys:
        flat = Partition(root, key, layout)
        # A move into parts/ that a crash cut short leaves a partition in both places.
        # ``flatten`` deletes no old file before every new name is durable, so one of the two
        # holds every segment: read the one with more (the next start finishes the move).
        if key not in partitions or len(flat.on_disk()) > len(partitions[key].on_disk()):
            partitions[key] = flat
    return dict(sorted(partitions.items()))


def _wal(root: Path, problems: list[str] | None = None) -> dict[str, Any]:
    """The WAL's segments and bytes; its groups checked when ``problems`` is given."""
    directory = wal_root(root)
    seqs = segments(directory)
    groups = 0
    if problems is not None:
        for _ in read_tail(root, WalPosition(0, 0), fs=None, report=problems.append):
            groups += 1
    return {
        "segments": len(seqs),
        "bytes": sum((directory / f"wal-{s:012d}.log").stat().st_size for s in seqs),
        **({"entries": groups} if problems is not None else {}),
    }


def inspect(directory: Path, *, granularity_ms: int = 300_000) -> dict[str, Any]:
    """Partitions (window, files, bytes, messages, pending), snapshot state, damage seen."""
    root = log_root(directory)
    partitions = _partitions(root, granularity_ms)
    state = Recovered()
    load_snapshot(root, partitions, state)
    for partition in partitions.values():
        replay(partition, state, build_index=False, readonly=True)
    manifest = state.manifest
    rows = []
    for number, partition in sorted(partitions.items()):
        files = partition.on_disk()
        start_index, level = Layout.split_key(number)
        rows.append(
            {
                # The name's number (start // granularity) and its level (``layout.py``).
                "partition": start_index,
                "level": level,
                "start_ms": partition.start_ms,
                "end_ms": partition.end_ms,
                "segments": len(files),
                "bytes": sum(size for _, size in files),
                "messages": partition.total,
                "pending": partition.live,
            }
        )
    return {
        "directory": str(root),
        "partitions": rows,
        "pending": sum(r["pending"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "snapshot": None
        if manifest is None
        else {
            "seq": manifest.seq,
            "created_ms": manifest.created_ms,
            "parts": len(manifest.parts),
            "part_bytes": sum(p["bytes"] for p in manifest.parts),
            "indexed_partitions": sorted(int(n) for n in manifest.indexed),
            "wal": manifest.wal,
        },
        "wal": _wal(root),
        "replayed_records": state.replayed_records,
        "problems": state.damaged,
    }


def verify(directory: Path) -> dict[str, Any]:
    """Check every record's checksum and every snapshot part; report, never fix."""
    root = log_root(directory)
    problems: list[str] = []
    records = 0
    files = _segment_files(root)
    for path in files:
        data = path.read_bytes()
        for item in scan(data):
            if isinstance(item, Record):
                records += 1
            elif isinstance(item, Damage):
                what = "torn tail" if item.torn else "damaged record"
                problems.append(f"{path} at byte {item.offset}: {what} ({item.reason})")
    manifests = 0
    directory_s = snapshot_root(root)
    for path in sorted(directory_s.glob("manifest-*")) if directory_s.exists() else []:
        if path.name.endswith(".tmp"):
            problems.append(f"{path}: unfinished manifest (ignored by recovery)")
            continue
        manifests += 1
        try:
            manifest = Manifest.validate(path.read_bytes())
            read_blob(directory_s, manifest, 0, len(manifest.parts))
        except (ManifestError, SnapshotError) as exc:
            problems.append(f"{path}: {exc}")
    return {
        "directory": str(root),
        "segments": len(files),
        "records": records,
        "wal": _wal(root, problems),
        "manifests": manifests,
        "problems": problems,
        "ok": not problems,
    }
