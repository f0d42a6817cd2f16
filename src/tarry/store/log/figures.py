"""Figures of the log store's write path for ``/metrics``: fsyncs by what they made durable
(counted by ``fs.OsFiles``), group commits (``writer.py``) and how long snapshots take, kept as
plain ints and read at scrape time."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tarry.store.log.writer import GroupWriter

__all__ = ["SNAPSHOT_BOUNDS_S", "SnapshotTimes", "write_path"]

#: Upper bounds (seconds) of the snapshot duration histogram's buckets.
SNAPSHOT_BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class SnapshotTimes:
    """How long each snapshot took, from capture to its manifest's directory fsync."""

    def __init__(self) -> None:
        #: One count per bound, and the last for slower than every bound (not cumulative).
        self.counts = [0] * (len(SNAPSHOT_BOUNDS_S) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(SNAPSHOT_BOUNDS_S, seconds)] += 1
        self.sum_s += seconds

    def figures(self) -> dict[str, Any]:
        """``{"bounds": [...], "counts": [...], "sum": s}`` (counts per bucket, +Inf last)."""
        return {"bounds": list(SNAPSHOT_BOUNDS_S), "counts": list(self.counts), "sum": self.sum_s}


def write_path(
    fsyncs: Mapping[str, int], writer: GroupWriter, times: SnapshotTimes
) -> dict[str, Any]:
    """What the write path has done: fsyncs by what they made durable, group commits, WAL
    bytes, and checkpoint durations (a checkpoint's snapshot is its duration)."""
    figures = times.figures()
    return {
        "fsyncs": dict(fsyncs),
        "group_commits": writer.groups,
        "durable_group_commits": writer.durable_groups,
        "wal_bytes": writer.wal.bytes_written,
        "snapshot_seconds": figures,
        "checkpoint_seconds": figures,
    }
