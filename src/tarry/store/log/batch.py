"""What one ``LogStore.store`` call appends, laid out in one vectorised pass however many
partitions its due times touch: the records sorted by partition (a stable ``argsort`` of their
partition keys) and joined into one blob, cut into runs, one per partition (split where a run
would pass a segment), each a slice of the blob that gets one reservation and one write in the
group commit. The due times and record offsets the partitions' indexes take are arrays in the
blob's order; no Python object per message and only a few steps per run (a batch due over a year
touches some 100–190 partitions)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from tarry.model.message import Message
from tarry.store.log.held import Held
from tarry.store.log.layout import Layout
from tarry.store.log.partition import Partition

__all__ = ["Placed", "place"]

I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class Placed:
    """A batch's records in append order, and its runs (one partition's slice each)."""

    #: The records joined in partition order (stable: a partition's records in the order given).
    data: bytes
    #: Each run's partition; run ``r`` is rows ``rows[r]:rows[r + 1]`` of the arrays below and
    #: bytes ``bounds[r]:bounds[r + 1]`` of ``data``.
    partitions: list[Partition]
    rows: list[int]
    bounds: list[int]
    #: The rows of the messages as given, in ``data``'s order (None: the order given).
    order: I64 | None
    #: Due time and offset in ``data`` of each record, in ``data``'s order.
    dues: I64
    offsets: I64

    def slices(self) -> list[tuple[Partition, memoryview]]:
        """(partition, its run's bytes) of each run: what the group writer appends."""
        view = memoryview(self.data)
        bounds = self.bounds
        return [(p, view[bounds[r] : bounds[r + 1]]) for r, p in enumerate(self.partitions)]

    def index(
        self, run: int, base: int, messages: Sequence[Message], latest_sent: int
    ) -> dict[str, Held]:
        """Run ``run``, appended at ``base``, into its partition's index (it has one). Returns
        its messages sent without delay by id (none when every due time is past
        ``latest_sent``, the batch's latest ``sent_at_ms``): released at once, by id."""
        partition = self.partitions[run]
        assert partition.index is not None
        a, b = self.rows[run], self.rows[run + 1]
        dues, positions = self.dues[a:b], self.positions(run, base)
        partition.index.add(dues, positions)
        if int(dues.min()) > latest_sent:
            return {}  # a delayed batch: no loop over its messages
        rows = range(a, b) if self.order is None else self.order[a:b].tolist()
        now = {}
        for i, row in enumerate(rows):
            m = messages[row]
            if m.deliver_at_ms <= m.sent_at_ms:
                now[m.id] = Held(
                    partition.number, int(positions[i]), m.deliver_at_ms, m.destination
                )
        return now

    def positions(self, run: int, base: int) -> I64:
        """The positions of run ``run``'s records, appended at position ``base``."""
        rows = self.rows
        return self.offsets[rows[run] : rows[run + 1]] - self.bounds[run] + base


def place(
    dues: Sequence[int] | I64,
    records: Sequence[bytes],
    *,
    layout: Layout,
    now_ms: int,
    segment_bytes: int,
    partitions_of: Callable[[list[int]], list[Partition]],
) -> Placed:
    """``records`` (one per message, due at ``dues``) laid out by the partition of their due
    time as placed at ``now_ms`` (``layout.keys_for``); a run larger than ``segment_bytes`` is
    split so that no run spans segments (a single larger record is a run of its own).
    ``partitions_of(keys)`` gives the partitions of a list of keys, in order."""
    n = len(records)
    due = dues if isinstance(dues, np.ndarray) else np.fromiter(dues, np.int64, n)
    lengths = np.fromiter(map(len, records), np.int64, n)
    keys = layout.keys_for(due, now_ms)
    first = int(keys[0])
    order: I64 | None = None
    if bool((keys == first).all()):  # a batch mostly falls in one partition
        data = b"".join(records)
        rows, run_keys = [0, n], [first]
    else:
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        rows = [0, *cuts.tolist(), n]
        run_keys = ordered[rows[:-1]].tolist()
        data = b"".join(itemgetter(*order.tolist())(records))
        due, lengths = due[order], lengths[order]
    ends = np.cumsum(lengths)
    offsets = ends - lengths
    bounds = [0, *ends[np.array(rows[1:]) - 1].tolist()]
    if len(data) > segment_bytes:
        rows, bounds, run_keys = _split_runs(ends, rows, bounds, run_keys, segment_bytes)
    return Placed(data, partitions_of(run_keys), rows, bounds, order, due, offsets)


def _split_runs(
    ends: I64, rows: list[int], bounds: list[int], keys: list[int], segment_bytes: int
) -> tuple[list[int], list[int], list[int]]:
    """The runs cut where one would pass ``segment_bytes`` (``ends``: each record's end in the
    blob): each piece fits, or holds one record however large."""
    out_rows, out_bounds, out_keys = [0], [0], []
    for r, key in enumerate(keys):
        a, b = rows[r], rows[r + 1]
        if bounds[r + 1] - bounds[r] <= segment_bytes:
            pieces = [(a, b)]
        else:
            runs = _segment_runs(ends[a:b] - bounds[r], segment_bytes)
            pieces = [(a + start, a + stop) for start, stop in runs]
        for _, stop in pieces:
            out_rows.append(stop)
            out_bounds.append(int(ends[stop - 1]))
            out_keys.append(key)
    return out_rows, out_bounds, out_keys


def _segment_runs(ends: I64, segment_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) runs of records, whose cumulative sizes are ``ends``, that each fit in
    ``segment_bytes`` (or hold one record, however large)."""
    n = len(ends)
    runs: list[tuple[int, int]] = []
    start, base = 0, 0
    while start < n:
        stop = max(start + 1, int(np.searchsorted(ends, base + segment_bytes, side="right")))
        runs.append((start, stop))
        start, base = stop, int(ends[stop - 1])
    return runs
