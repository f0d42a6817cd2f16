"""The start-up scrub: once the store is open, every partition's records are checked against
their CRC32C in the background, nearest due first.

Recovery reads only what its snapshot does not cover (and, after a clean close, nothing), so a
flipped byte in a partition due next month would otherwise stay unseen until that partition is
indexed, while ``/healthz`` said ``ok``. The scrub names it in ``/healthz`` (``damaged``) and
``/metrics`` (``tarry_store_damaged``) within moments of the start instead. It reads on a
thread of its own, only the bytes written before the start, and sleeps after each partition as
long as it read, so it takes at most about half a core from a start that has much to check.
"""

from __future__ import annotations

import time
from pathlib import Path

from tarry.store.log.partition import Partition
from tarry.store.log.record import Damage, scan

__all__ = ["damage_line", "scrub_partition"]

#: Records checked between two offers of the GIL: the thread would otherwise keep it for the
#: interpreter's whole switch interval while the event loop waits for it.
_YIELD_EVERY = 1_000


def damage_line(path: Path, offset: int, reason: str) -> str:
    """One damaged stretch as ``/healthz`` names it: the same line whichever path finds it
    first (recovery, a read, or the scrub)."""
    return f"{path} at byte {offset}: {reason}"


def scrub_partition(partition: Partition, lengths: list[int]) -> list[str]:
    """Damage in the first ``lengths[k]`` bytes of each segment ``k`` of ``partition`` (a file
    shorter than that is damage too). Nothing when cleanup deleted the partition meanwhile."""
    found: list[str] = []
    for segment, length in enumerate(lengths):
        path = partition.segment_path(segment)
        try:
            with open(path, "rb") as handle:
                data = handle.read(length)
        except FileNotFoundError:
            return found
        for count, item in enumerate(scan(data)):
            if count % _YIELD_EVERY == 0:
                time.sleep(0)  # let the event loop's thread have the GIL
            if isinstance(item, Damage):
                short = item.torn and len(data) < length
                reason = f"file ends at byte {len(data)} of {length}" if short else item.reason
                found.append(damage_line(path, item.offset, reason))
    return found
