"""Recovery: load the newest complete snapshot (a valid manifest whose parts all check), then
replay only what every partition's segments hold past the sizes that manifest recorded; with no
usable snapshot, replay everything. A torn tail (a short or failing record at the end of a
partition's last segment) is cut off; damage anywhere else is reported with the file name and
offset and skipped. Orphans (temp files, snapshot directories without a manifest, manifests
older than the one loaded) are deleted, with one log line each.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tarry.store.log.fs import Files
from tarry.store.log.held import Failure
from tarry.store.log.index import DueIndex
from tarry.store.log.manifest import Manifest, ManifestError
from tarry.store.log.partition import Partition, position
from tarry.store.log.record import FAILED, MOVED, Damage, Record, parse_record, scan
from tarry.store.log.record_walk import ReplayEntries, replay_walk
from tarry.store.log.snapshot import (
    SnapshotError,
    dedupe_arrays,
    index_arrays,
    read_blob,
)

__all__ = ["Recovered", "load_snapshot", "replay", "sweep_orphans"]

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    """Everything recovery rebuilds besides the partitions themselves."""

    manifest: Manifest | None = None
    dedupe: dict[int, str] = field(default_factory=dict)
    scheduled: Counter[str] = field(default_factory=Counter)
    failures: dict[str, Failure] = field(default_factory=dict)
    forwards: dict[str, int] = field(default_factory=dict)
    #: The keys of ``dedupe`` by the partition that may hold their message, so that cleanup
    #: finds a deleted partition's keys without reading them all (``cleanup.file_keys``). Made
    #: again at every open (``cleanup.file_all``), not kept in snapshots.
    filed: dict[int, list[int]] = field(default_factory=dict)
    #: Keys whose id carries no due time: filed under no partition, never dropped.
    unfiled: list[int] = field(default_factory=list)
    #: A deleted partition's keys while cleanup looks at them again, a few thousand a step.
    #: With ``filed`` and ``unfiled``, every key of ``dedupe`` is in one of these lists, which
    #: only grow between two cleanups: a checkpoint reads the keys from them (``snapshot.py``).
    refiling: list[list[int]] = field(default_factory=list)
    #: Damaged files, one line each: what ``health`` and ``tarry store verify`` report.
    damaged: list[str] = field(default_factory=list)
    replayed_records: int = 0

    def report(self, line: str) -> bool:
        """Add a damage line unless it is known already (recovery, a read and the scrub may
        each come across the same record); True when it is new."""
        if line in self.damaged:
            return False
        self.damaged.append(line)
        return True


def snapshot_root(root: Path) -> Path:
    return root / "snapshots"


def load_snapshot(root: Path, partitions: dict[int, Partition], out: Recovered) -> None:
    """Apply the newest complete snapshot to ``partitions`` and ``out`` (nothing if none)."""
    directory = snapshot_root(root)
    if not directory.exists():
        return
    manifests = sorted(
        (p for p in directory.glob("manifest-*") if not p.name.endswith(".tmp")), reverse=True
    )
    for path in manifests:
        try:
            manifest = Manifest.validate(path.read_bytes())
            indexes = {
                int(n): index_arrays(read_blob(directory, manifest, first, count), entries)
                for n, (first, count, entries) in manifest.indexed.items()
            }
            first, count, entries = manifest.dedupe
            hashes, ids = dedupe_arrays(read_blob(directory, manifest, first, count), entries)
        except (ManifestError, SnapshotError, ValueError) as exc:
            log.error("snapshot %s is unusable (%s); trying an older one", path.name, exc)
            out.damaged.append(f"{path}: {exc}")
            continue
        for number_text, header in manifest.partitions.items():
            number = int(number_text)
            partition = partitions.get(number)
            if partition is None:
                continue  # deleted by cleanup after this snapshot
            partition.sizes = list(header["sizes"])
            partition.total, partition.finished = header["total"], header["finished"]
            if number in indexes:
                partition.index = DueIndex(*indexes[number])
        out.dedupe = dict(zip(hashes.tolist(), (i.decode() for i in ids.tolist()), strict=True))
        out.scheduled = Counter(manifest.scheduled)
        out.failures = {
            k: Failure(int(v[0]), str(v[1]), int(v[2]) if len(v) > 2 else 0)
            for k, v in manifest.failures.items()
        }
        out.forwards = dict(manifest.forwards)
        # Applied: keep the manifest's name and parts, not its per-partition copy.
        manifest.partitions, manifest.failures, manifest.forwards = {}, {}, {}
        out.manifest = manifest
        log.info("loaded snapshot %s", path.name)
        return


def sweep_orphans(root: Path, keep_seq: int | None, *, fs: Files) -> None:
    """Delete what no kept manifest names: temp files and snapshot directories without a
    manifest (orphans: a warning each), and snapshots older than the two newest at or below
    ``keep_seq`` (superseded: the previous one is kept as a fallback)."""
    directory = snapshot_root(root)
    if not directory.exists():
        return
    seqs = sorted(
        int(p.name.split("-", 1)[1])
        for p in directory.glob("manifest-*")
        if p.name.split("-", 1)[1].isdigit()
    )
    keep = set(s for s in seqs if keep_seq is None or s <= keep_seq)
    keep = set(sorted(keep)[-2:])
    for path in sorted(directory.iterdir()):
        seq_text = path.name.split("-", 1)[-1]
        if path.name.endswith(".tmp") or not seq_text.isdigit():
            log.warning("deleting orphan snapshot file %s", path)
        elif int(seq_text) in keep:
            continue
        elif path.name.startswith("snap-") and int(seq_text) not in seqs:
            log.warning("deleting orphan snapshot file %s (no manifest names it)", path)
        else:
            log.info("removing superseded snapshot file %s", path)
        if path.is_dir():
            fs.remove_tree(path)
        else:
            fs.unlink(path)


def _unchanged(partition: Partition, known: list[int]) -> bool:
    """True when the last segment the snapshot knows has its recorded size and no segment
    follows it (two ``stat`` calls instead of a directory listing per partition)."""
    last = len(known) - 1
    try:
        if os.stat(partition.segment_path(last)).st_size != known[last]:
            return False
    except FileNotFoundError:
        return False
    if os.path.exists(partition.segment_path(last + 1)):
        return False
    partition.written = list(known)
    return True


def _apply(found: ReplayEntries, data: bytes, partition: Partition, out: Recovered) -> None:
    """A stretch's records (``replay_walk``) applied to the partition's counts and ``out``."""
    out.replayed_records += found.records
    partition.total += found.messages
    partition.finished += found.finished
    scheduled = out.scheduled
    for destination, count in found.counts.items():
        scheduled[destination.decode("utf-8")] += count
    dedupe = out.dedupe
    for key, keyed_id in found.keyed:
        dedupe[key] = keyed_id.decode("ascii")
    failures, forwards = out.failures, out.forwards
    for kind, raw_id, value, offset in found.changes:  # in log order: a failure, then its end
        message_id = raw_id.decode("ascii")
        if kind == FAILED:
            record = parse_record(data, offset)
            assert isinstance(record, Record)
            failures[message_id] = Failure(*record.failure(), value)
            continue
        failures.pop(message_id, None)
        if kind == MOVED:
            forwards[message_id] = value


def _whole_records_end(path: Path, length: int) -> int:
    """Where the last whole record of the first ``length`` bytes of ``path`` ends."""
    with open(path, "rb") as handle:
        data = handle.read(length)
    end = 0
    for item in scan(data):
        if not isinstance(item, Damage):
            end = item.offset + item.size
    return end


def replay(
    partition: Partition,
    out: Recovered,
    *,
    build_index: bool,
    readonly: bool = False,
    trusted: bool = False,
    fs: Files | None = None,
) -> None:
    """Apply the records past ``partition.sizes`` (all of them when ``sizes`` is empty) to the
    partition's counts, ``out``, and (``build_index``) its index (a partition that becomes due
    later is indexed by ``indexing.py``). ``readonly`` (the inspection tools) reports a torn
    tail instead of cutting it; ``trusted`` (a clean close after the snapshot, ``clean.py``)
    takes the snapshot's sizes unchecked. A torn tail is cut through ``fs``; without one
    (``readonly``) nothing is cut."""
    known = list(partition.sizes)
    partition.unchecked = known
    if known and trusted:
        partition.written = known
        return
    if known and _unchanged(partition, known):
        return  # the snapshot covers every byte: not even a directory listing
    unchecked: list[int] = []
    files = partition.on_disk()
    sizes: list[int] = []
    #: The index entries of each segment read, as arrays (a list of ints per entry would
    #: hold about 40 bytes an entry for a whole partition while recovery reads it).
    new: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
    gone: list[int] = []
    for segment, (path, actual) in enumerate(files):
        start = known[segment] if segment < len(known) else 0
        if actual < start:
            # The snapshot named bytes the disk does not have (written without an fsync, lost
            # to a power loss): appends must go on from the end of its last whole record.
            log.warning("%s holds %d bytes, fewer than the snapshot recorded", path, actual)
            start = _whole_records_end(path, actual)
            if start < actual and fs is not None:
                fs.truncate_path(path, start)
                actual = start
        unchecked.append(start)
        if actual == start:
            sizes.append(start)  # nothing past what the snapshot covers: no read at all
            continue
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read()
        size = start + len(data)
        last = segment == len(files) - 1
        found = ReplayEntries()
        offset = 0
        while offset < len(data):
            offset = replay_walk(data, offset, found)
            if offset >= len(data):
                break
            item = next(scan(data, offset))  # the walk stops only where no record is
            assert isinstance(item, Damage), f"{path}: a record the walk refused"
            where = f"{path} at byte {start + item.offset}"
            tail = item.torn and last
            if tail and readonly:
                out.report(f"{where}: torn tail ({item.reason}), cut on next start")
                size = start + item.offset
            elif tail and fs is not None:
                log.warning("cutting a torn tail off %s (%s)", where, item.reason)
                fs.truncate_path(path, start + item.offset)
                size = start + item.offset
            else:
                log.error("damaged record in %s (%s); skipped", where, item.reason)
                out.report(f"{where}: {item.reason}")
            offset = item.end
        _apply(found, data, partition, out)
        if build_index and found.due:
            offsets = np.array(found.offsets, dtype=np.int64)
            new.append((np.array(found.due, dtype=np.int64), offsets + position(segment, start)))
        gone += found.gone
        sizes.append(size)
    partition.sizes = sizes
    partition.written = list(sizes)
    partition.unchecked = unchecked
    if not build_index:
        return
    if partition.index is None:
        partition.index = DueIndex()
    if new:
        dues = np.concatenate([d for d, _ in new])
        poss = np.concatenate([p for _, p in new])
        if gone:
            keep = ~np.isin(poss, np.array(gone, dtype=np.int64))
            dues, poss = dues[keep], poss[keep]
        partition.index.add(dues, poss)
    if gone:
        partition.index.drop_positions(np.array(gone, dtype=np.int64))
