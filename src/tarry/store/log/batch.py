"""What one ``LogStore.store`` call appends: its records grouped by partition, one contiguous
append per group (one reservation, one write in the group commit), a group never spanning
segments; with the due times and record offsets the partition's index takes, as arrays, once
the append is written (no Python object per message on the way)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tarry.model.message import Message
from tarry.store.log.layout import Layout
from tarry.store.log.partition import Partition

__all__ = ["Group", "group_records"]

I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class Group:
    """The records one ``store`` call appends to one partition, in the order given."""

    partition: Partition
    records: list[bytes]
    messages: Sequence[Message]
    #: Each message's due time, and its record's offset from the start of the group's append.
    dues: I64
    offsets: I64


def group_records(
    messages: Sequence[Message],
    records: list[bytes],
    *,
    layout: Layout,
    now_ms: int,
    segment_bytes: int,
    partition_of: Callable[[int, Message], Partition],
) -> list[Group]:
    """``records`` (one per message) grouped by the partition of their due time (as placed at
    ``now_ms``: ``layout.keys_for``), each group split where it would pass ``segment_bytes`` (a
    group larger than a segment starts a new one; a single larger record is a group of its
    own). ``partition_of(number, message)`` gives the partition ``number`` that ``message`` (the
    first of a group) is appended to."""
    n = len(messages)
    dues = np.fromiter((m.deliver_at_ms for m in messages), np.int64, n)
    lengths = np.fromiter(map(len, records), np.int64, n)
    groups: list[Group] = []
    for number, rows in _by_number(layout.keys_for(dues, now_ms)):
        if rows is None:  # the whole batch
            group_messages, group_records_, group_dues, group_lengths = (
                messages,
                records,
                dues,
                lengths,
            )
        else:
            picked = rows.tolist()
            group_messages = [messages[i] for i in picked]
            group_records_ = [records[i] for i in picked]
            group_dues, group_lengths = dues[rows], lengths[rows]
        ends = np.cumsum(group_lengths)
        for start, stop in _segment_runs(ends, segment_bytes):
            offsets = ends[start:stop] - group_lengths[start:stop]
            groups.append(
                Group(
                    partition_of(number, group_messages[start]),
                    group_records_[start:stop],
                    group_messages[start:stop],
                    group_dues[start:stop],
                    offsets - offsets[0],
                )
            )
    return groups


def _by_number(numbers: I64) -> list[tuple[int, I64 | None]]:
    """(partition number, rows of it in order) for each number; rows None: every row (a batch
    mostly falls in one partition)."""
    first = int(numbers[0])
    if bool((numbers == first).all()):
        return [(first, None)]
    order = np.argsort(numbers, kind="stable")
    ordered = numbers[order]
    starts = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(ordered)]
    return [(int(ordered[a]), order[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=False)]


def _segment_runs(ends: I64, segment_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) runs of records, whose cumulative sizes are ``ends``, that each fit in
    ``segment_bytes`` (or hold one record, however large)."""
    n = len(ends)
    if int(ends[-1]) <= segment_bytes:
        return [(0, n)]
    runs: list[tuple[int, int]] = []
    start, base = 0, 0
    while start < n:
        stop = max(start + 1, int(np.searchsorted(ends, base + segment_bytes, side="right")))
        runs.append((start, stop))
        start, base = stop, int(ends[stop - 1])
    return runs
