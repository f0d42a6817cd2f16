"""``IndexBuild``: a partition's ``DueIndex`` built from its records a step at a time, so that
the store can index a partition while it is still ahead (``prefetch_ms``) with the event loop
free between steps: read back in one go, a partition that steady traffic filled for half a
minute stalled every release behind it.

The build reads only bytes the writer has finished (``Partition.written``). Whatever the writer
finishes while the build goes on is read by later steps, and ``finish`` reads the rest in the
same event-loop step that hands the index over: appends and markers that complete after that
update the index themselves (they do nothing to a partition without one). Nothing it reads is a
torn tail, so whatever fails its checks is damage, reported and left out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from tarry.store.log.index import I64, DueIndex, sort_entries
from tarry.store.log.partition import Partition, position
from tarry.store.log.record import Damage, Record, scan
from tarry.store.log.record_walk import IndexEntries, index_walk
from tarry.store.log.recovery import Recovered

if TYPE_CHECKING:
    from tarry.store.log.table import PartitionTable

__all__ = ["CHUNK_BYTES", "STEP_RECORDS", "IndexAhead", "IndexBuild", "load"]

log = logging.getLogger(__name__)

#: Records a background step reads before the event loop gets a turn: what else waits that long.
STEP_RECORDS = 500
#: Bytes read from a segment file at a time (a stretch is read within one step).
CHUNK_BYTES = 1024 * 1024


class IndexBuild:
    def __init__(
        self, partition: Partition, state: Recovered, flush: Callable[[Partition], None]
    ) -> None:
        """``flush`` writes out the partition's bytes still held in memory (``SegmentFiles``)."""
        self.partition = partition
        self._state = state
        self._flush = flush
        #: Bytes read so far of each segment; a segment before the last may still be finishing
        #: writes, so each is looked at again until the end.
        self._read: list[int] = []
        self._segment = 0
        self._base = 0
        #: The stretch ends before the finished bytes do (its last record may be cut through).
        self._cut = False
        self._chunk = self._stretch = CHUNK_BYTES
        #: The stretch being read, and how far.
        self._data = b""
        self._offset = 0
        #: The entries of the messages read, an array pair per walk.
        self._parts: list[tuple[I64, I64]] = []
        #: The first ``_sorted_parts`` parts, sorted by due time (``sort_read``).
        self._sorted: tuple[I64, I64] | None = None
        self._sorted_parts = self._sorted_gone = 0
        #: Positions of messages a marker finished.
        self._gone: list[int] = []
        self._started = time.perf_counter()
        self.steps = 0
        #: Stretches read (a read each).
        self.reads = 0

    def step(self, records: int = STEP_RECORDS) -> bool:
        """Read up to ``records`` more records; True once every finished byte is read."""
        self.steps += 1
        left = records
        while left > 0:
            data, offset = self._data, self._offset
            if offset >= len(data):
                if not self._next_stretch():
                    return True
                continue
            found = IndexEntries()
            self._offset = index_walk(data, offset, left, found)
            stopped = found.records < left and self._offset < len(data)
            left -= found.records
            self._state.replayed_records += found.records
            if found.due:
                base = position(self._segment, self._base)
                offsets = np.array(found.offsets, dtype=np.int64)
                self._parts.append((np.array(found.due, dtype=np.int64), offsets + base))
            self._gone += found.gone
            if stopped:  # not a valid record there
                left -= 1
                self._not_a_record(next(scan(data, self._offset)))
        return False

    async def sort_read(self, held: Iterable[int]) -> None:
        """Join and sort what has been read so far, less what the markers read so far and
        ``held`` took out, on a thread (numpy lets the event loop run meanwhile): ``finish``
        then sorts only what is read after, and takes out only what was finished after."""
        count, gone = len(self._parts), len(self._gone)
        parts = self._parts[:count]
        drop = np.array([*self._gone[:gone], *held], dtype=np.int64)

        def sorted_run() -> tuple[I64, I64]:
            return sort_entries(*_without(_joined(parts), drop))

        self._sorted = await asyncio.to_thread(sorted_run)
        self._sorted_parts, self._sorted_gone = count, gone

    def finish(self, held: Iterable[int]) -> DueIndex:
        """The index: every finished byte read (in this call, without yielding), less the
        messages markers finished and the positions ``held`` outside the index (claimed,
        waiting or leaving)."""
        while not self.step():
            pass
        held = list(held)
        index = DueIndex()
        if self._sorted is not None:  # what the markers read since take out: mostly nothing
            late = np.array([*self._gone[self._sorted_gone :], *held], dtype=np.int64)
            index = DueIndex(*_without(self._sorted, late))
        rest = self._parts[self._sorted_parts :]
        if rest:
            index.add(*_without(_joined(rest), np.array([*self._gone, *held], dtype=np.int64)))
        log.info(
            "indexed partition %d: %d pending in %.3f s (%d steps, %d reads)",
            self.partition.number,
            len(index),
            time.perf_counter() - self._started,
            self.steps,
            self.reads,
        )
        return index

    def _next_stretch(self) -> bool:
        """Start on the next finished bytes not read yet, up to ``_chunk`` of them; False when
        there are none."""
        written = self.partition.written
        read = self._read
        read.extend([0] * (len(written) - len(read)))
        for segment, done in enumerate(written):
            start = read[segment]
            if done > start:
                self._flush(self.partition)
                path = self.partition.segment_path(segment)
                want = min(done - start, self._chunk)
                self._stretch, self._chunk = want, CHUNK_BYTES
                with open(path, "rb") as handle:
                    handle.seek(start)
                    data = handle.read(want)
                if len(data) < want:
                    line = f"{path}: {done - start - len(data)} written bytes missing at the end"
                    log.error("%s; skipped", line)
                    self._state.report(line)
                    want = done - start
                self.reads += 1
                self._segment, self._base = segment, start
                self._cut = start + want < done
                self._data, self._offset = data, 0
                read[segment] = start + want
                return True
        return False

    def _not_a_record(self, item: Record | Damage) -> None:
        """Bytes ``index_walk`` stopped at, as ``scan`` reads them."""
        # The walk stops only where ``parse_record`` finds no record (the same checks).
        assert isinstance(item, Damage), f"partition {self.partition.number}: a record skipped"
        if item.torn and self._cut:
            # A record the stretch's end cut through (or damage with no valid record after it
            # in the stretch): read again from there; in a longer stretch when nothing whole
            # was in this one.
            self._read[self._segment] = self._base + item.offset
            self._chunk = CHUNK_BYTES if item.offset else 2 * self._stretch
        else:
            path = self.partition.segment_path(self._segment)
            where = f"{path} at byte {self._base + item.offset}"
            log.error("damaged record in %s (%s); skipped", where, item.reason)
            self._state.report(f"{where}: {item.reason}")
        self._offset = item.end


def _joined(parts: list[tuple[I64, I64]]) -> tuple[I64, I64]:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([d for d, _ in parts]), np.concatenate([p for _, p in parts])


def _without(entries: tuple[I64, I64], drop: I64) -> tuple[I64, I64]:
    """``entries`` less those at the positions ``drop`` (order kept)."""
    due, pos = entries
    if not len(drop) or not len(pos):
        return due, pos
    keep = ~np.isin(pos, drop)
    return due[keep], pos[keep]


def load(table: PartitionTable, partition: Partition) -> None:
    """Index ``partition`` now: a build begun ahead of time is finished in this call, or its
    records are read all at once."""
    if partition.index is not None:
        return
    build = table.building.pop(partition.number, None)
    if build is None:
        build = IndexBuild(partition, table.state, table.flush)
    partition.index = build.finish(_held(table, partition))


def _held(table: PartitionTable, partition: Partition) -> list[int]:
    """Positions of ``partition``'s messages claimed, waiting or leaving: never indexed twice."""
    return [h.pos for h in table.held() if h.number == partition.number]


class IndexAhead:
    """Builds partitions' indexes ahead of their start, one task each, a step at a time with
    the event loop's other work in between."""

    def __init__(self, table: PartitionTable) -> None:
        self._table = table
        self._tasks: dict[int, asyncio.Task[None]] = {}
        #: Partitions whose background build failed: read all at once when due instead (the
        #: round then fails as a read fails), not built again every round.
        self._failed: set[int] = set()

    def start(self, partition: Partition) -> bool:
        """Begin indexing ``partition`` in the background, unless it is under way; False when
        a build of it failed (index it at once when it is needed)."""
        number = partition.number
        if number in self._failed:
            return False
        if partition.index is None and number not in self._tasks:
            table = self._table
            build = table.building[number] = IndexBuild(partition, table.state, table.flush)
            self._tasks[number] = asyncio.get_running_loop().create_task(
                self._build(build), name=f"tarry-index-{number}"
            )
        return True

    async def index(self, partition: Partition) -> None:
        """``partition`` indexed, built in the background (waited for, not cancelled with the
        caller)."""
        self.start(partition)
        task = self._tasks.get(partition.number)
        if task is not None:
            await asyncio.shield(task)
        load(self._table, partition)  # a failed build: read all at once

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _turn(self) -> None:
        """The event loop's turn between two steps."""
        await asyncio.sleep(0)

    async def _build(self, build: IndexBuild) -> None:
        table, partition = self._table, build.partition
        number = partition.number
        try:
            # What is held in memory for it written out beside the loop, not in the first step.
            await asyncio.to_thread(table.flush, partition)
            # Until done, or finished by a ``load`` when the partition fell due first.
            while partition.index is None and table.building.get(number) is build:
                if build.step():
                    await build.sort_read(_held(table, partition))
                    if table.building.get(number) is build:
                        load(table, partition)  # only what the sort ran beside is left
                    return
                await self._turn()
        except Exception:
            # Read again, all at once, when it falls due.
            log.exception("indexing partition %d ahead of time failed", number)
            self._failed.add(number)
            if table.building.get(number) is build:
                del table.building[number]
        finally:
            del self._tasks[number]
