"""The rows the last receives of an SQLite queue database handed out, kept in memory by row key
until they are acked, so that an ack need not read every column of its rows again to tell its
listeners what it acked (``QueueTxn.settle``).

It is a memory, not the truth: the ack's UPDATE itself checks that each row is still in flight
under the receipt acked, and a row it does not hold (evicted, or handed out before a restart) is
read from the table as before. A write that changes a message in flight other than by its state
(a policy's new queue expiry, ``queues/ttl_change.py``) clears it. Bounded by count and by body
bytes: a consumer that never acks costs only the oldest entries, which are forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

__all__ = ["HandedOut"]

#: What is kept of one row: its receipt, its columns as the receive read them (``SELECT_SQL``'s
#: order), and the time of that receive.
Entry = tuple[str, Sequence[Any], int]


class HandedOut:
    def __init__(self, *, max_rows: int = 100_000, max_body_bytes: int = 64 * 1024 * 1024) -> None:
        self._max_rows = max_rows
        self._max_body_bytes = max_body_bytes
        #: Row key → (entry, its body's size), oldest first (an OrderedDict forgets its first
        #: in constant time; a dict would walk the slots its earlier first ones left).
        self._rows: OrderedDict[int, tuple[Entry, int]] = OrderedDict()
        self._body_bytes = 0

    def __len__(self) -> int:
        return len(self._rows)

    def keep(self, key: int, entry: Entry, body_bytes: int) -> None:
        """Remember the row of ``key`` as a receive handed it out (a later receive of the same
        row replaces it)."""
        self.forget(key)
        self._rows[key] = (entry, body_bytes)
        self._body_bytes += body_bytes
        while len(self._rows) > self._max_rows or self._body_bytes > self._max_body_bytes:
            self._body_bytes -= self._rows.popitem(last=False)[1][1]

    def get(self, key: int, receipt: str) -> Entry | None:
        """The row of ``key`` when it was handed out under ``receipt``."""
        found = self._rows.get(key)
        if found is None or found[0][0] != receipt:
            return None
        return found[0]

    def clear(self) -> None:
        self._rows.clear()
        self._body_bytes = 0

    def forget(self, key: int) -> None:
        found = self._rows.pop(key, None)
        if found is not None:
            self._body_bytes -= found[1]
