"""Order of arrival in local queues: one number per message entering a queue (FIFO)."""

from __future__ import annotations

from tarry.model.time import Clock
from tarry.store.sql import SqlConnection

__all__ = ["ClockSequencer", "Sequencer", "last_seq"]


class Sequencer:
    """Order of arrival in queues (FIFO); a requeued message keeps its place."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    def next(self) -> int:
        self.value += 1
        return self.value

    def next_many(self, count: int) -> range | list[int]:
        """``next()`` ``count`` times, in order."""
        start = self.value + 1
        self.value += count
        return range(start, start + count)


class ClockSequencer(Sequencer):
    """For queues that several nodes fill (a shared PostgreSQL store): arrival order is the
    arrival time in ms, then this node's count within the ms (up to 1000 per ms, then it runs
    ahead of the clock). Nodes' clocks must agree, as they must for due times anyway."""

    def __init__(self, clock: Clock, start: int = 0) -> None:
        super().__init__(start)
        self._clock = clock

    def next(self) -> int:
        self.value = max(self.value + 1, self._clock.now_ms() * 1000)
        return self.value

    def next_many(self, count: int) -> range | list[int]:
        return [self.next() for _ in range(count)]


def last_seq(conn: SqlConnection) -> int:
    """The highest arrival number given so far: where a restarted ``Sequencer`` goes on."""
    return int(conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0])
