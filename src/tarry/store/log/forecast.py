"""How many messages fall due per time window (the console's forecast), from what the log store
keeps in memory: each partition's count of live messages and, for the partitions that are due
soon, their ``DueIndex``. No segment is read.

A partition without a loaded index counts by its whole window: a forecast window narrower than
a partition gets the partition's messages in proportion to the overlap (rounded so that the
windows covering a partition add up to its count exactly)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tarry.store.log.partition import Partition

if TYPE_CHECKING:
    from tarry.store.log.table import PartitionTable

__all__ = ["due_counts"]


def due_counts(table: PartitionTable, *, start_ms: int, width_ms: int, buckets: int) -> list[int]:
    """Live messages due in each ``[start_ms + i * width_ms, start_ms + (i + 1) * width_ms)``."""
    counts = [0] * max(buckets, 0)
    if buckets <= 0 or width_ms <= 0:
        return counts
    end_ms = start_ms + width_ms * buckets
    for number in table.reaching(start_ms):  # by start: a coarse one may begin before
        partition = table.partitions.get(number)
        if partition is None:
            continue
        if partition.start_ms >= end_ms:
            break
        if partition.live <= 0:
            continue
        low = max(0, (partition.start_ms - start_ms) // width_ms)
        high = min(buckets - 1, (partition.end_ms - 1 - start_ms) // width_ms)
        for window in range(low, high + 1):
            lo = start_ms + window * width_ms
            counts[window] += _count(partition, lo, lo + width_ms)
    return counts


def _count(partition: Partition, lo_ms: int, hi_ms: int) -> int:
    if partition.index is not None:
        return partition.index.count_between(lo_ms, hi_ms)

    def share(t_ms: int) -> int:
        clipped = min(max(t_ms, partition.start_ms), partition.end_ms)
        return (
            partition.live
            * (clipped - partition.start_ms)
            // (partition.end_ms - partition.start_ms)
        )

    return share(hi_ms) - share(lo_ms)
