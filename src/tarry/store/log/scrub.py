"""The start-up scrub: once the store is open, every partition's records are checked against
their CRC32C in the background, nearest due first.

Recovery reads only what its snapshot does not cover (and, after a clean close, nothing), so a
flipped byte in a partition due next month would otherwise stay unseen until that partition is
indexed, while ``/healthz`` said ``ok``. The scrub names it in ``/healthz`` (``damaged``) and
``/metrics`` (``tarry_store_damaged``) within moments of the start instead. It reads the bytes
recovery did not (``Partition.unchecked``; what recovery read it checked the same way) on a
thread of its own, and sleeps after each partition as long as it read, so it takes at most
about half a core from a start that has much to check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from tarry.store.log.partition import Partition
from tarry.store.log.record import Damage, scan
from tarry.store.log.record_walk import valid_records

if TYPE_CHECKING:
    from tarry.store.log.table import PartitionTable

__all__ = ["damage_line", "scrub_all", "scrub_partition"]

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
        offset = 0
        while offset < len(data):
            for count, (_, _, end) in enumerate(valid_records(data, offset), 1):
                offset = end
                if count % _YIELD_EVERY == 0:
                    time.sleep(0)  # let the event loop's thread have the GIL
            if offset >= len(data):
                break
            item = next(scan(data, offset))  # not a record: as ``scan`` names it
            assert isinstance(item, Damage)
            short = item.torn and len(data) < length
            reason = f"file ends at byte {len(data)} of {length}" if short else item.reason
            found.append(damage_line(path, item.offset, reason))
            offset = item.end
    return found


async def scrub_all(
    table: PartitionTable,
    pool: ThreadPoolExecutor,
    *,
    on_partition: Callable[[], None],
    log: logging.Logger,
) -> None:
    """Check every partition of ``table`` found at the start, nearest due first, on ``pool``:
    the bytes recovery did not read; damage goes to ``table.state`` (and the log),
    ``on_partition`` after each."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    scrubbed = 0
    for number in list(table.numbers):
        partition = table.partitions.get(number)
        if partition is None or not partition.written:
            continue
        lengths = list(partition.written if partition.unchecked is None else partition.unchecked)
        began = time.perf_counter()
        lines: list[str] = []
        try:
            if any(lengths):  # none: recovery read it all
                table.flush(partition)
                lines = await loop.run_in_executor(pool, scrub_partition, partition, lengths)
        except Exception as exc:  # unreadable (EIO, permissions): that is damage too
            lines = [f"partition {partition.name}: cannot be read ({exc})"]
        for line in lines:
            if table.state.report(line):
                log.error("damaged record found by the start-up check: %s", line)
        scrubbed += 1
        on_partition()
        await asyncio.sleep(time.perf_counter() - began)
    log.info(
        "start-up check: %d partitions read in %.3f s, %d damaged records or files known",
        scrubbed,
        time.perf_counter() - started,
        len(table.state.damaged),
    )
