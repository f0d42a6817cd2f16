"""``Layout``: which time partition a message goes to, so that the number of partitions stays
bounded however far ahead messages are due.

Partitions near now are ``granularity_ms`` wide (level 0); further out they are coarser, each
level ``FACTOR`` times wider than the one below, up to ``MAX_LEVEL``. A message due ``d`` ms
from now goes to the finest level whose partitions are at most ``1/PER_LEVEL`` of ``d`` wide::

    level L: width granularity·4^L, for messages due within granularity·16·4^L (level 0: all
             nearer ones; MAX_LEVEL: all further ones)

With the default 5-minute granularity: 5 min, 20 min, 80 min, 5.3 h, 21 h and 3.6 days; a year
of due times takes about 100 partitions of the top level and some 12 to 16 of each lower one,
instead of 105,120 five-minute partitions (one file and write each). A coarse partition is
not split when it comes near: it is indexed whole once its start is within ``prefetch_ms`` (16
bytes per pending message; at most 3.6 days of messages), and deleted once its window is over
and every message in it is released.

Why these numbers (``FACTOR`` 4, ``PER_LEVEL`` 16, ``MAX_LEVEL`` 5): a year of uniform due times
takes about 165 partitions, a file (an inode) each; ``PER_LEVEL`` 8 would take 135, ``MAX_LEVEL``
6 about 100 (6 and 8: 65), ``MAX_LEVEL`` 7 about 94. Each level up makes the widest partition 4
times wider, and a partition is indexed whole when it comes near: with 100,000,000 pending over
a year a 3.6-day partition holds ~1,000,000 messages (16 MB of index, and its records read once
to build it, on a background thread), a 14-day one ~3,900,000 (62 MB, four times the reading),
a 57-day one ~15,600,000. One inode a partition (not a directory and a file each) already
halves what a year's new partitions cost the file system (bench/README, issue 22); the 30 to 65
fewer files the other numbers would save were not measured apart (the benchmark's pairs spread
by a third on a shared machine), and the bound on what one partition costs to index is worth
more. ``FACTOR`` and the granularity fix every key already written and cannot change;
``MAX_LEVEL`` can grow to 7 (the key's 3 level bits) and ``PER_LEVEL`` can change without
touching stored keys (they only decide where new messages go; ``candidates`` looks at every
level).

A partition's key orders partitions by start: ``start // granularity << 3 | level``. Level 0 keys
are ``number << 3`` where ``number = due // granularity`` names the partition ``p-<number>``, as
in the stores written before the layout; coarser partitions are ``p<level>-<start //
granularity>``. Their segment files are ``<root>/parts/<name>.seg-<n>.log`` (``migrate.py``).
The offline import (``pipeline/sink_log.py``) places its copies with ``keys_for``, the
vectorised ``key_for``, so its areas hold the same partitions. Partitions of different levels
may overlap in time (a message due next month was placed at level 5 a month ago; one sent today
for the same moment goes to a finer level): finding a message by id looks at each level's partition
covering its due time (``candidates``: at most ``MAX_LEVEL + 1`` dictionary lookups).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["FACTOR", "MAX_LEVEL", "PER_LEVEL", "Layout"]

FACTOR: int = 4
PER_LEVEL = 16
MAX_LEVEL = 5
_LEVEL_BITS = 3
_LEVEL_MASK = (1 << _LEVEL_BITS) - 1


class Layout:
    def __init__(self, granularity_ms: int) -> None:
        self.granularity_ms = granularity_ms
        self._widths: list[int] = [granularity_ms * FACTOR**level for level in range(MAX_LEVEL + 1)]

    @property
    def widest_ms(self) -> int:
        """The width of the coarsest partitions."""
        return self._widths[MAX_LEVEL]

    def level_for(self, due_ms: int, now_ms: int) -> int:
        ahead = due_ms - now_ms
        for level in range(MAX_LEVEL):
            if ahead < PER_LEVEL * self._widths[level]:
                return level
        return MAX_LEVEL

    def key(self, due_ms: int, level: int) -> int:
        """The key of the level-``level`` partition covering ``due_ms``."""
        width = self._widths[level]
        start = due_ms // width * width
        return (start // self.granularity_ms) << _LEVEL_BITS | level

    def key_for(self, due_ms: int, now_ms: int) -> int:
        """The partition a message due at ``due_ms`` goes to when it arrives at ``now_ms``."""
        return self.key(due_ms, self.level_for(due_ms, now_ms))

    def keys_for(self, dues: npt.NDArray[np.int64], now_ms: int) -> npt.NDArray[np.int64]:
        """``key_for`` of each due time of a batch, as an array."""
        widths = np.array(self._widths, np.int64)
        levels = np.searchsorted(PER_LEVEL * widths[:MAX_LEVEL], dues - now_ms, side="right")
        return self._keys(dues, widths[levels], levels)

    def keys_at(self, dues: npt.NDArray[np.int64], level: int) -> npt.NDArray[np.int64]:
        """``key(d, level)`` of each due time, as an array."""
        return self._keys(dues, self._widths[level], level)

    def _keys(self, dues: npt.NDArray[np.int64], width: Any, level: Any) -> npt.NDArray[np.int64]:
        keys: npt.NDArray[np.int64] = (
            (dues // width * width) // self.granularity_ms
        ) << _LEVEL_BITS | level
        return keys

    def candidates(self, due_ms: int) -> list[int]:
        """Every partition key that may hold a message due at ``due_ms``, finest first."""
        return [self.key(due_ms, level) for level in range(MAX_LEVEL + 1)]

    def window(self, key: int) -> tuple[int, int]:
        """``[start_ms, end_ms)`` of partition ``key``."""
        start = (key >> _LEVEL_BITS) * self.granularity_ms
        return start, start + self._widths[key & _LEVEL_MASK]

    def first_key_at(self, start_ms: int) -> int:
        """The smallest key of a partition starting at or after ``start_ms`` (for bisecting
        the sorted keys by time)."""
        return -(-start_ms // self.granularity_ms) << _LEVEL_BITS

    @staticmethod
    def level0(number: int) -> int:
        """The key of fine partition ``number`` (``due // granularity``: a directory of a store
        written before the layout, or of a version-1 offline import)."""
        return number << _LEVEL_BITS

    @staticmethod
    def split_key(key: int) -> tuple[int, int]:
        """(start // granularity, level) of partition ``key``."""
        return key >> _LEVEL_BITS, key & _LEVEL_MASK

    @staticmethod
    def name_of(key: int) -> str:
        """Partition ``key``'s name, ``p-<number>`` (level 0) or ``p<level>-<start // G>`` (G:
        the granularity): the prefix of its segment files (``<name>.seg-<n>.log``) and, in
        stores written before the flat layout, its directory."""
        level, number = key & _LEVEL_MASK, key >> _LEVEL_BITS
        return f"p-{number:010d}" if level == 0 else f"p{level}-{number:010d}"

    @staticmethod
    def parse_name(name: str) -> int | None:
        """The key a partition's name gives, or None (not a partition)."""
        head, _, number = name.partition("-")
        if not head.startswith("p") or not number.isdigit():
            return None
        level_text = head[1:] or "0"
        if not level_text.isdigit() or int(level_text) > MAX_LEVEL:
            return None
        return int(number) << _LEVEL_BITS | int(level_text)

    @staticmethod
    def segment_name(key: int, segment: int) -> str:
        """The file name of segment ``segment`` of partition ``key`` (in ``<root>/parts/``)."""
        return f"{Layout.name_of(key)}.seg-{segment:06d}.log"

    @staticmethod
    def parse_segment(name: str) -> tuple[int, int] | None:
        """(key, segment) of a segment file's name (``segment_name``), or None."""
        stem, dot, rest = name.partition(".seg-")
        digits = rest.removesuffix(".log")
        if not dot or not rest.endswith(".log") or not digits.isdigit():
            return None
        key = Layout.parse_name(stem)
        return None if key is None else (key, int(digits))
