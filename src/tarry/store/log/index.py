"""``DueIndex``: the compact in-memory index of one loaded time partition: two int64 arrays, due
time and record position, sorted by due time (16 bytes per pending message; no Python object
per message).

- ``main`` is sorted and consumed from ``head``; new arrivals go to ``incoming`` (an
  ``array('q')`` pair, cheap to extend by whole batches) and are merged in by a stable sort of
  two sorted runs (timsort merges them in linear time) once they are due or numerous.
- Removed entries (cancelled, released outside a fetch) are remembered by position in ``dead``
  and skipped when reached; this set only holds changes to a loaded partition.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["DueIndex"]

I64 = npt.NDArray[np.int64]
_EMPTY: I64 = np.zeros(0, dtype=np.int64)


class DueIndex:
    def __init__(self, due: I64 | None = None, pos: I64 | None = None) -> None:
        self._due: I64 = _EMPTY if due is None else due
        self._pos: I64 = _EMPTY if pos is None else pos
        self._head = 0
        self._in_due = array("q")
        self._in_pos = array("q")
        self._in_min: int | None = None
        self.dead: set[int] = set()

    def __len__(self) -> int:
        return len(self._due) - self._head + len(self._in_due) - len(self.dead)

    @property
    def nbytes(self) -> int:
        """Bytes the arrays hold (the ``dead`` set aside, which only holds changes)."""
        return int(self._due.nbytes + self._pos.nbytes) + 16 * len(self._in_due)

    def add(self, due: I64 | Sequence[int], pos: I64 | Sequence[int]) -> None:
        """Index entries (due time, record position): a stored batch's arrays at once."""
        dues = np.asarray(due, np.int64)
        if not len(dues):
            return
        self._in_due.frombytes(dues.tobytes())
        self._in_pos.frombytes(np.asarray(pos, np.int64).tobytes())
        low = int(dues.min())
        if self._in_min is None or low < self._in_min:
            self._in_min = low
        if len(self._in_due) > max(65_536, (len(self._due) - self._head) // 8):
            self._merge()

    def _merge(self) -> None:
        if not self._in_due:
            return
        due = np.concatenate((self._due[self._head :], np.frombuffer(self._in_due, np.int64)))
        pos = np.concatenate((self._pos[self._head :], np.frombuffer(self._in_pos, np.int64)))
        order = np.argsort(due, kind="stable")
        self._due, self._pos, self._head = due[order], pos[order], 0
        self._in_due, self._in_pos, self._in_min = array("q"), array("q"), None

    def next_due(self) -> int | None:
        self._skip_dead()
        best = int(self._due[self._head]) if self._head < len(self._due) else None
        if self._in_min is not None and (best is None or self._in_min < best):
            best = self._in_min
        return best

    def _skip_dead(self) -> None:
        while self._head < len(self._due) and self.dead:
            pos = int(self._pos[self._head])
            if pos not in self.dead:
                return
            self.dead.discard(pos)
            self._head += 1

    def pop_due(self, now_ms: int, limit: int) -> tuple[list[int], list[int]]:
        """Up to ``limit`` entries due at or before ``now_ms``, in due order, as (due times,
        positions). Read a slice of the arrays at a time (what is still wanted), its due part
        found by ``bisect`` on the slice's list and a removed entry looked for only where the
        slice holds one: a round's batch costs a few array calls, not a Python step per entry.
        Not ``searchsorted``: it lets go of the GIL, and the event loop then waits for another
        thread to give it back."""
        if self._in_min is not None and self._in_min <= now_ms:
            self._merge()
        head, size = self._head, len(self._due)
        dues: list[int] = []
        poss: list[int] = []
        if head >= size or self._due[head] > now_ms:
            return dues, poss  # nothing due yet: most rounds of a sparse partition
        dead = self.dead
        while head < size and len(dues) < limit:
            window = self._due[head : head + limit - len(dues)].tolist()
            due_count = bisect_right(window, now_ms)
            if not due_count:
                break
            positions = self._pos[head : head + due_count].tolist()
            head += due_count
            if not dead or dead.isdisjoint(positions):
                dues += window[:due_count] if due_count < len(window) else window
                poss += positions
            else:
                for due, pos in zip(window, positions, strict=False):
                    if pos in dead:
                        dead.discard(pos)
                    else:
                        dues.append(due)
                        poss.append(pos)
            if due_count < len(window):
                break
        self._head = head
        if self._head > 1_000_000 and self._head > len(self._due) // 2:
            self._due, self._pos, self._head = self._due[head:].copy(), self._pos[head:].copy(), 0
        return dues, poss

    def count_between(self, lo_ms: int, hi_ms: int) -> int:
        """Live entries due in ``[lo_ms, hi_ms)``: two binary searches, plus a look at the
        arrivals not merged yet and at the removed entries."""
        main_due = self._due[self._head :]
        a = int(np.searchsorted(main_due, lo_ms, side="left"))
        b = int(np.searchsorted(main_due, hi_ms, side="left"))
        count = b - a
        dead = np.fromiter(self.dead, np.int64, len(self.dead)) if self.dead else None
        if dead is not None and count:
            count -= int(np.isin(self._pos[self._head + a : self._head + b], dead).sum())
        if self._in_due:
            due = np.frombuffer(self._in_due, np.int64)
            inside = (due >= lo_ms) & (due < hi_ms)
            count += int(inside.sum())
            if dead is not None:
                pos = np.frombuffer(self._in_pos, np.int64)
                count -= int(np.isin(pos[inside], dead).sum())
        return count

    def discard(self, due: int, pos: int) -> bool:
        """Remove the entry (due, pos) if it is still indexed; True when it was."""
        if pos in self.dead:
            return False
        lo = max(self._head, int(np.searchsorted(self._due, due, side="left")))
        hi = int(np.searchsorted(self._due, due, side="right"))
        found = lo < hi and bool((self._pos[lo:hi] == pos).any())
        if not found:
            incoming = np.frombuffer(self._in_pos, np.int64) if self._in_pos else _EMPTY
            found = bool((incoming == pos).any())
        if found:
            self.dead.add(pos)
        return found

    def arrays(self) -> tuple[I64, I64]:
        """Every live entry (a copy), sorted by due: what a snapshot stores."""
        self._merge()
        due, pos = self._due[self._head :], self._pos[self._head :]
        if self.dead:
            keep = ~np.isin(pos, np.fromiter(self.dead, np.int64, len(self.dead)))
            return due[keep].copy(), pos[keep].copy()
        return due.copy(), pos.copy()

    def drop_positions(self, positions: I64) -> None:
        """Forget entries by position in bulk (replaying markers on recovery)."""
        if not len(positions):
            return
        self._merge()
        keep = ~np.isin(self._pos[self._head :], positions)
        self._due = self._due[self._head :][keep]
        self._pos = self._pos[self._head :][keep]
        self._head = 0
