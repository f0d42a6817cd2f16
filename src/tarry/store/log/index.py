"""``DueIndex``: the compact in-memory index of one loaded time partition: int64 arrays of due
time and record position, sorted by due time (16 bytes per pending message; no Python object
per message).

- New arrivals go to ``incoming`` (an ``array('q')`` pair, cheap to extend by whole batches).
  It is sorted into a *run* of its own once one of its entries falls due or it holds
  ``seal_at`` entries.
- Runs are sorted, consumed from their heads, and oldest first. A new run is merged with the
  one before it while that one is not much larger, but never into a run past ``merge_cap``
  (all runs are merged into one while they hold no more than that together, as after a
  burst): merging into everything pending (hundreds of thousands of entries) stalled the
  event loop each time an arrival fell due, where a few runs cost a few list calls a round.
- Removed entries (cancelled, released outside a fetch) are remembered by position in ``dead``
  and skipped when reached; this set only holds changes to a loaded partition.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DueIndex", "sort_entries"]

I64 = npt.NDArray[np.int64]
_EMPTY: I64 = np.zeros(0, dtype=np.int64)
#: Arrivals sorted into a run of their own at this many.
SEAL_AT = 16_384
#: No merge makes a run larger than this.
MERGE_CAP = 131_072
#: A round's first look at a run's head reads this many entries.
_FIRST_SLICE = 32
#: Runs' due parts merged by a sort in Python up to this many entries, of arrays beyond.
_SORT_IN_PYTHON = 512


@dataclass(slots=True)
class _Run:
    due: I64
    pos: I64
    head: int = 0

    def __len__(self) -> int:
        return len(self.due) - self.head

    def live(self) -> tuple[I64, I64]:
        return self.due[self.head :], self.pos[self.head :]


def sort_entries(due: I64, pos: I64) -> tuple[I64, I64]:
    """(due, pos) sorted by due, stably."""
    order = np.argsort(due, kind="stable")
    return due[order], pos[order]


def _sorted(due: I64, pos: I64) -> _Run:
    # Stable: among equal due times the older run's entries (first here) stay first.
    return _Run(*sort_entries(due, pos))


class DueIndex:
    def __init__(
        self,
        due: I64 | None = None,
        pos: I64 | None = None,
        *,
        seal_at: int = SEAL_AT,
        merge_cap: int = MERGE_CAP,
    ) -> None:
        self._runs: list[_Run] = []
        if due is not None and pos is not None and len(due):
            self._runs.append(_Run(due, pos))
        self._in_due = array("q")
        self._in_pos = array("q")
        self._in_min: int | None = None
        self._seal_at = seal_at
        self._merge_cap = merge_cap
        self.dead: set[int] = set()

    def __len__(self) -> int:
        return sum(map(len, self._runs)) + len(self._in_due) - len(self.dead)

    @property
    def runs(self) -> int:
        """How many sorted runs the index holds now."""
        return len(self._runs)

    @property
    def nbytes(self) -> int:
        """Bytes the arrays hold (the ``dead`` set aside, which only holds changes)."""
        held = sum(int(run.due.nbytes + run.pos.nbytes) for run in self._runs)
        return held + 16 * len(self._in_due)

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
        if len(self._in_due) >= self._seal_at:
            self._seal()

    def _seal(self) -> None:
        """Sort the arrivals into a run, and merge it into the runs before it while they are
        not much larger (a binary counter's carries, stopped at ``merge_cap``), or into all of
        them while they hold no more than ``merge_cap`` together: a round then reads one run."""
        if not self._in_due:
            return
        run = _sorted(np.frombuffer(self._in_due, np.int64), np.frombuffer(self._in_pos, np.int64))
        self._in_due, self._in_pos, self._in_min = array("q"), array("q"), None
        runs = self._runs
        runs.append(run)
        few = sum(map(len, runs)) <= self._merge_cap
        while len(runs) > 1:
            older, newer = runs[-2], runs[-1]
            if not few and (
                len(older) > 2 * len(newer) or len(older) + len(newer) > self._merge_cap
            ):
                break
            (old_due, old_pos), (new_due, new_pos) = older.live(), newer.live()
            runs[-2:] = [
                _sorted(np.concatenate((old_due, new_due)), np.concatenate((old_pos, new_pos)))
            ]

    def _merge_all(self) -> _Run | None:
        """Every entry in one run (what a snapshot or a bulk removal works on)."""
        self._seal()
        runs = [run for run in self._runs if len(run)]
        if len(runs) > 1:
            lives = [run.live() for run in runs]
            merged = _sorted(
                np.concatenate([d for d, _ in lives]), np.concatenate([p for _, p in lives])
            )
            runs = [merged]
        self._runs = runs
        return runs[0] if runs else None

    def next_due(self) -> int | None:
        best: int | None = None
        for run in self._runs:
            self._skip_dead(run)
            if run.head < len(run.due):
                due = int(run.due[run.head])
                if best is None or due < best:
                    best = due
        if self._in_min is not None and (best is None or self._in_min < best):
            best = self._in_min
        return best

    def _skip_dead(self, run: _Run) -> None:
        dead = self.dead
        while run.head < len(run.due) and dead:
            pos = int(run.pos[run.head])
            if pos not in dead:
                return
            dead.discard(pos)
            run.head += 1

    def pop_due(self, now_ms: int, limit: int) -> tuple[list[int], list[int]]:
        """Up to ``limit`` entries due at or before ``now_ms``, in due order, as (due times,
        positions). Each run's due part is read a slice at a time (what is still wanted), found
        by ``bisect`` on the slice's list; several runs' parts are merged by one stable sort of
        what they hold due. Not ``searchsorted``: it lets go of the GIL, and the event loop then
        waits for another thread to give it back."""
        if self._in_min is not None and self._in_min <= now_ms:
            self._seal()
        dues: list[int] = []
        poss: list[int] = []
        while len(dues) < limit:
            want = limit - len(dues)
            parts = [
                (run, _due_part(run, now_ms, want))
                for run in self._runs
                if run.head < len(run.due) and run.due[run.head] <= now_ms
            ]
            if not parts:
                break
            if len(parts) == 1:
                run, taken_dues = parts[0]
                taken_pos = run.pos[run.head : run.head + len(taken_dues)].tolist()
                run.head += len(taken_dues)
            else:
                taken_dues, taken_pos = _merge_parts(parts, want)
            dead = self.dead
            if not dead or dead.isdisjoint(taken_pos):
                dues += taken_dues
                poss += taken_pos
            else:
                for due, pos in zip(taken_dues, taken_pos, strict=True):
                    if pos in dead:
                        dead.discard(pos)
                    else:
                        dues.append(due)
                        poss.append(pos)
        self._compact()
        return dues, poss

    def _compact(self) -> None:
        """Let go of runs consumed, and of the consumed half of a large one."""
        runs = self._runs
        if any(run.head >= len(run.due) for run in runs):
            self._runs = runs = [run for run in runs if run.head < len(run.due)]
        for run in runs:
            if run.head > 1_000_000 and run.head > len(run.due) // 2:
                run.due, run.pos = run.due[run.head :].copy(), run.pos[run.head :].copy()
                run.head = 0

    def count_between(self, lo_ms: int, hi_ms: int) -> int:
        """Live entries due in ``[lo_ms, hi_ms)``: two binary searches a run, plus a look at the
        arrivals not sorted yet and at the removed entries."""
        dead = np.fromiter(self.dead, np.int64, len(self.dead)) if self.dead else None
        count = 0
        for run in self._runs:
            due, pos = run.live()
            a = int(np.searchsorted(due, lo_ms, side="left"))
            b = int(np.searchsorted(due, hi_ms, side="left"))
            count += b - a
            if dead is not None and b > a:
                count -= int(np.isin(pos[a:b], dead).sum())
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
        found = False
        for run in self._runs:
            lo = max(run.head, int(np.searchsorted(run.due, due, side="left")))
            hi = int(np.searchsorted(run.due, due, side="right"))
            if lo < hi and bool((run.pos[lo:hi] == pos).any()):
                found = True
                break
        if not found and self._in_pos:
            found = bool((np.frombuffer(self._in_pos, np.int64) == pos).any())
        if found:
            self.dead.add(pos)
        return found

    def entries(self) -> tuple[I64, I64]:
        """Every live entry (a copy) run after run, each run sorted but not the whole: a
        snapshot's capture on the event loop, sorted (``sort_entries``) on another thread
        before it is stored, since a sort of everything pending is what stalled the loop."""
        self._seal()
        lives = [run.live() for run in self._runs if len(run)]
        if not lives:
            return _EMPTY.copy(), _EMPTY.copy()
        due = np.concatenate([d for d, _ in lives])
        pos = np.concatenate([p for _, p in lives])
        if self.dead:
            keep = ~np.isin(pos, np.fromiter(self.dead, np.int64, len(self.dead)))
            return due[keep], pos[keep]
        return due, pos

    def arrays(self) -> tuple[I64, I64]:
        """Every live entry (a copy), sorted by due (the runs merged into one)."""
        run = self._merge_all()
        if run is None:
            return _EMPTY.copy(), _EMPTY.copy()
        due, pos = run.live()
        if self.dead:
            keep = ~np.isin(pos, np.fromiter(self.dead, np.int64, len(self.dead)))
            return due[keep].copy(), pos[keep].copy()
        return due.copy(), pos.copy()

    def drop_positions(self, positions: I64) -> None:
        """Forget entries by position in bulk (replaying markers on recovery)."""
        if not len(positions):
            return
        run = self._merge_all()
        if run is None:
            return
        due, pos = run.live()
        keep = ~np.isin(pos, positions)
        self._runs = [_Run(due[keep], pos[keep])]


def _due_part(run: _Run, now_ms: int, want: int) -> list[int]:
    """The due times at the head of ``run`` that are due at ``now_ms``, at most ``want``: read
    in slices growing from a few entries, as a round mostly finds few due in each run."""
    head, size = run.head, _FIRST_SLICE
    while True:
        window: list[int] = run.due[head : head + min(size, want)].tolist()
        count = bisect_right(window, now_ms)
        if count < len(window) or len(window) >= want or head + count >= len(run.due):
            return window[:count] if count < len(window) else window
        size *= 8


def _merge_parts(parts: list[tuple[_Run, list[int]]], want: int) -> tuple[list[int], list[int]]:
    """The first ``want`` of several runs' due parts in due order (the older run first among
    equal times), each run's head moved past what it gave. A part holds up to ``want``
    entries, so the first ``want`` of them together are the first ``want`` of all."""
    if sum(len(part) for _, part in parts) > _SORT_IN_PYTHON:
        return _merge_parts_in_arrays(parts, want)
    merged = sorted((due, r, i) for r, (_, part) in enumerate(parts) for i, due in enumerate(part))[
        :want
    ]
    given = [0] * len(parts)
    for _, r, _ in merged:
        given[r] += 1
    positions = []
    for (run, _), count in zip(parts, given, strict=True):
        positions.append(run.pos[run.head : run.head + count].tolist())
        run.head += count
    return [due for due, _, _ in merged], [positions[r][i] for _, r, i in merged]


def _merge_parts_in_arrays(
    parts: list[tuple[_Run, list[int]]], want: int
) -> tuple[list[int], list[int]]:
    """``_merge_parts`` by one stable sort of arrays: for many entries."""
    due = np.concatenate([run.due[run.head : run.head + len(part)] for run, part in parts])
    pos = np.concatenate([run.pos[run.head : run.head + len(part)] for run, part in parts])
    source = np.repeat(np.arange(len(parts)), [len(part) for _, part in parts])
    order = np.argsort(due, kind="stable")[:want]
    for (run, _), given in zip(
        parts, np.bincount(source[order], minlength=len(parts)).tolist(), strict=True
    ):
        run.head += given
    return due[order].tolist(), pos[order].tolist()
