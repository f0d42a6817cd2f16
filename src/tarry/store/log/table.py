"""``PartitionTable``: the log store's partitions and the state that goes with them, owned in one
place: the partitions by key (``layout.py``) and in order, what recovery rebuilds
(``Recovered``: de-duplication keys, counts, failures, forwards), and the pending messages held
outside their partition's index (claimed, waiting to retry, leaving until their marker is
written). The snapshot, cleanup and find-by-id modules take this table, not the whole store.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tarry.store.log.held import Held
from tarry.store.log.index import DueIndex
from tarry.store.log.layout import Layout
from tarry.store.log.partition import Partition
from tarry.store.log.recovery import Recovered

if TYPE_CHECKING:
    from tarry.store.log.indexing import IndexBuild

__all__ = ["RECENT_MAX", "PartitionTable", "by_destination"]

RECENT_MAX = 200_000


class PartitionTable:
    def __init__(
        self,
        root: Path,
        layout: Layout,
        *,
        prefetch_ms: int,
        flush: Callable[[Partition], None],
    ) -> None:
        self.root = root
        #: Writes out what is held in memory for a partition: before reading its files.
        self.flush = flush
        self.layout = layout
        self.prefetch_ms = prefetch_ms
        self.partitions: dict[int, Partition] = {}
        #: The keys of ``partitions``, sorted (by start time: ``layout.py``).
        self.numbers: list[int] = []
        self.state = Recovered()
        self.claims: dict[str, Held] = {}
        #: Released claims and failed messages, due again at ``Held.due``.
        self.waiting: dict[str, Held] = {}
        self.leaving: dict[str, Held] = {}
        #: Indexes being built ahead of their partition's start, by partition key
        #: (``reading.load`` finishes one that falls due first).
        self.building: dict[int, IndexBuild] = {}
        #: Released messages whose markers wait to be written (``GroupWriter.defer``), by
        #: destination: no longer counted as scheduled (the queue database has them).
        self.deferred: Counter[str] = Counter()
        #: (due, id) of ``waiting``; stale entries are skipped.
        self.retry_heap: list[tuple[int, str]] = []
        #: Messages sent without delay, remembered by id so that their release at once (by the
        #: send path, not a fetch) needs no lookup; bounded (``RECENT_MAX``).
        self.recent: dict[str, Held] = {}
        #: The newest time a fetch was asked for (new partitions near it are indexed at once).
        self.now_ms = 0
        #: Messages finished since the last checkpoint.
        self.changes = 0
        #: Messages put back after a marker failed (``put_back``) and not finished since: the
        #: queue database may hold their release (``LogStore.may_leave``).
        self.came_back: set[str] = set()

    def partition(self, number: int, *, now_ms: int | None = None) -> Partition:
        """The partition ``number``, made when it is new. A partition made for a new message
        (``now_ms`` given: it has no files yet) within ``prefetch_ms`` of falling due is indexed
        from birth, as the store would index it on loading (empty: nothing to read back)."""
        partition = self.partitions.get(number)
        if partition is None:
            partition = Partition(self.root, number, self.layout)
            if now_ms is not None and partition.start_ms <= now_ms + self.prefetch_ms:
                partition.index = DueIndex()
            self.partitions[number] = partition
            bisect.insort(self.numbers, number)
        return partition

    def partitions_for(self, keys: Sequence[int], *, now_ms: int) -> list[Partition]:
        """``partition(key, now_ms=now_ms)`` of each key (a stored batch's runs), found with
        one look-up each and made only where new."""
        found: list[Partition | None] = list(map(self.partitions.get, keys))
        if None not in found:
            return found  # type: ignore[return-value]  # no None left
        return [
            p if p is not None else self.partition(k, now_ms=now_ms)
            for k, p in zip(keys, found, strict=True)
        ]

    def drop(self, partition: Partition) -> None:
        """Forget a deleted partition."""
        if self.partitions.get(partition.number) is partition:
            del self.partitions[partition.number]
            self.building.pop(partition.number, None)
            self.numbers.remove(partition.number)

    def held(self) -> list[Held]:
        """Every pending message outside its partition's index."""
        return [*self.claims.values(), *self.waiting.values(), *self.leaving.values()]

    def reaching(self, time_ms: int) -> list[int]:
        """The keys of the partitions whose window ends after ``time_ms``, in order (a coarse
        partition that began before ``time_ms`` may still cover it)."""
        earliest = self.layout.first_key_at(time_ms - self.layout.widest_ms)
        first = bisect.bisect_left(self.numbers, earliest)
        return [n for n in self.numbers[first:] if self.partitions[n].end_ms > time_ms]

    def holding(self, due_ms: int) -> list[Partition]:
        """The partitions that may hold a message due at ``due_ms`` (one per level at most)."""
        return [
            p for k in self.layout.candidates(due_ms) if (p := self.partitions.get(k)) is not None
        ]

    # --- pending messages outside the index -----------------------------------------------
    def wait(self, message_id: str, held: Held, due: int) -> None:
        """``held`` waits beside the retries, due again at ``due``."""
        held.due = due
        self.waiting[message_id] = held
        heapq.heappush(self.retry_heap, (due, message_id))

    def due_waiting(self, now_ms: int, limit: int) -> list[tuple[str | None, Held]]:
        """Up to ``limit`` waiting messages due at ``now_ms``, taken out of ``waiting``."""
        picked: list[tuple[str | None, Held]] = []
        heap = self.retry_heap
        while heap and heap[0][0] <= now_ms and len(picked) < limit:
            due, message_id = heapq.heappop(heap)
            waiting = self.waiting.get(message_id)
            if waiting is not None and waiting.due == due:
                del self.waiting[message_id]
                picked.append((message_id, waiting))
        return picked

    def next_waiting(self) -> int | None:
        best: int | None = None
        for due, message_id in self.retry_heap:
            held = self.waiting.get(message_id)
            if held is not None and held.due == due:
                best = due if best is None else min(best, due)
        return best

    def take(self, message_id: str) -> Held | None:
        """Take a pending message out of circulation (claims, waiting, or the index)."""
        held = self.claims.pop(message_id, None) or self.waiting.pop(message_id, None)
        if held is not None:
            return held
        recent = self.recent.pop(message_id, None)
        if recent is not None:
            partition = self.partitions.get(recent.number)
            if partition is not None and partition.index is not None:
                if partition.index.discard(recent.due, recent.pos):
                    return recent
        return None

    def finished(self, taken: Sequence[tuple[str, Held]]) -> None:
        """Bookkeeping once their RELEASED / CANCELLED / MOVED markers are written, the counts
        changed once per partition and destination (a released batch mostly shares both)."""
        leaving, failures = self.leaving.pop, self.state.failures.pop
        # Counted in the one pass (a ``Counter`` each costs more than the pass at a round's
        # few dozen messages).
        numbers: dict[int, int] = {}
        destinations: dict[str, int] = {}
        if self.came_back:
            self.came_back.difference_update(message_id for message_id, _ in taken)
        for message_id, held in taken:
            leaving(message_id, None)
            failures(message_id, None)
            number, destination = held.number, held.destination
            numbers[number] = numbers.get(number, 0) + 1
            destinations[destination] = destinations.get(destination, 0) + 1
        for number, count in numbers.items():
            partition = self.partitions.get(number)
            if partition is not None:
                partition.finished += count
        for destination, count in destinations.items():
            self.state.scheduled[destination] -= count
        self.changes += len(taken)

    def defer(self, taken: Sequence[tuple[str, Held]]) -> dict[str, int]:
        """Released into local queues, their markers deferred (``deferred``); returns their
        count by destination, for ``deferred_done``. Plain dicts, as in ``finished``: a
        ``Counter`` built and added costs more than the pass at a round's few messages."""
        counts = by_destination(taken)
        deferred = self.deferred
        for destination, count in counts.items():
            deferred[destination] += count
        return counts

    def deferred_done(
        self, taken: Sequence[tuple[str, Held]], counts: dict[str, int], *, written: bool
    ) -> None:
        """Deferred markers written (``finished``) or failed (``put_back``)."""
        deferred = self.deferred
        for destination, count in counts.items():
            deferred[destination] -= count
        if written:
            self.finished(taken)
        else:
            self.put_back(taken)

    def scheduled(self, destination: str | None) -> int:
        """Messages pending (of ``destination``, or all), released ones with deferred markers
        left out."""
        if destination is None:
            live = sum(p.live for p in self.partitions.values())
            return live - sum(self.deferred.values())
        return max(0, self.state.scheduled.get(destination, 0) - self.deferred[destination])

    def put_back(self, taken: Sequence[tuple[str, Held]]) -> None:
        """Markers that could not be written: their messages wait, due again at once, so the
        step is retried (a release again is a no-op in the queue database; its marker is
        written then) instead of staying out of circulation until a restart."""
        for message_id, held in taken:
            if self.leaving.pop(message_id, None) is not None:
                self.wait(message_id, held, held.due)
                self.came_back.add(message_id)


def by_destination(taken: Sequence[tuple[str, Held]]) -> dict[str, int]:
    """How many of ``taken`` each destination has (what ``deferred_done`` takes back)."""
    counts: dict[str, int] = {}
    for _, held in taken:
        counts[held.destination] = counts.get(held.destination, 0) + 1
    return counts
