"""Rows an SQLite queue database wrote or read lately, kept in memory by key so that the next
statement about them need not read every column again: the rows a release wrote, until a
receive takes them (``queues/ready_rows.py``), and the rows a receive handed out, until they
are acked (``queues/receipts.ack_handed_out``).

A memory, not the truth: the statement that uses an entry checks the row itself (a receive
takes the rows its own query finds; an ack's UPDATE checks each row is still in flight under
its receipt), and a row the memory does not hold (forgotten, or written before a restart) is
read from the table as before. A write that changes a queued message other than by its state
(a policy's new queue expiry, ``queues/ttl_change.py``) clears both. Bounded by count and by
body bytes: rows nobody takes (a queue without consumers, a consumer that never acks) cost only
the oldest entries, which are forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

__all__ = ["RowMemory"]


class RowMemory:
    def __init__(self, *, max_rows: int = 100_000, max_body_bytes: int = 64 * 1024 * 1024) -> None:
        self._max_rows = max_rows
        self._max_body_bytes = max_body_bytes
        #: Key → (entry, its body's size), oldest first (an OrderedDict forgets its first in
        #: constant time; a dict would walk the slots its earlier first ones left).
        self._rows: OrderedDict[int, tuple[Any, int]] = OrderedDict()
        self._body_bytes = 0

    def __len__(self) -> int:
        return len(self._rows)

    def keep(self, key: int, entry: Any, body_bytes: int) -> None:
        """Remember ``entry`` under ``key`` (replacing what was there)."""
        self.forget(key)
        self._rows[key] = (entry, body_bytes)
        self._body_bytes += body_bytes
        while len(self._rows) > self._max_rows or self._body_bytes > self._max_body_bytes:
            self._body_bytes -= self._rows.popitem(last=False)[1][1]

    def keep_many(self, entries: Iterable[tuple[int, Any, int]]) -> None:
        """``keep`` of each (key, entry, body bytes), in order; the oldest forgotten once, after
        them all (a receive keeps hundreds of rows at a time)."""
        rows = self._rows
        pop = rows.pop
        total = self._body_bytes
        for key, entry, body_bytes in entries:
            found = pop(key, None)
            if found is not None:
                total -= found[1]
            rows[key] = (entry, body_bytes)
            total += body_bytes
        while len(rows) > self._max_rows or total > self._max_body_bytes:
            total -= rows.popitem(last=False)[1][1]
        self._body_bytes = total

    def get(self, key: int) -> Any:
        """The entry kept under ``key``, or None."""
        found = self._rows.get(key)
        return None if found is None else found[0]

    def forget(self, key: int) -> None:
        found = self._rows.pop(key, None)
        if found is not None:
            self._body_bytes -= found[1]

    def forget_many(self, keys: Iterable[int]) -> None:
        pop = self._rows.pop
        total = self._body_bytes
        for key in keys:
            found = pop(key, None)
            if found is not None:
                total -= found[1]
        self._body_bytes = total

    def clear(self) -> None:
        self._rows.clear()
        self._body_bytes = 0
