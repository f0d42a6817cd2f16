"""Appending a batch of new MESSAGE records, whichever form they came in (``LogStore.store``'s
messages, ``LogStore.store_columns``'s columns): laid out by partition (``batch.place``), one
group-commit append, and once written the partitions' counts and due indexes, the counts by
destination and the de-duplication keys brought up to date. It takes the parts of the store it
changes, not the store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tarry.model.message import Message
from tarry.store.log.batch import place
from tarry.store.log.layout import Layout
from tarry.store.log.table import RECENT_MAX, PartitionTable
from tarry.store.log.writer import GroupWriter

__all__ = ["Appender", "NewRecords"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class NewRecords:
    """One batch's records and what the store keeps in memory of them, row for row."""

    records: Sequence[bytes]
    due_ms: Sequence[int] | I64
    destinations: Sequence[str]
    #: The latest ``sent_at_ms`` of the batch.
    latest_sent_ms: int
    #: The messages, read only for those sent without delay (the partition index's ``recent``).
    messages: Sequence[Message]
    #: (de-duplication key, message) of the keyed ones, made known once written.
    keyed: Sequence[tuple[int, Message]] = ()


@dataclass(frozen=True, slots=True)
class Appender:
    table: PartitionTable
    layout: Layout
    writer: GroupWriter
    #: De-duplication keys of messages being written (``LogStore._unwritten``).
    unwritten: dict[int, Message]

    async def append(self, new: NewRecords, *, now_ms: int) -> None:
        """Append ``new`` durably (per the fsync policy), due times placed as of ``now_ms``."""
        table = self.table
        placed = place(
            new.due_ms,
            new.records,
            layout=self.layout,
            now_ms=now_ms,
            segment_bytes=self.writer.segment_bytes,
            partitions_of=lambda keys: table.partitions_for(keys, now_ms=now_ms),
        )
        state, unwritten = table.state, self.unwritten
        dedupe, scheduled, filed = state.dedupe, state.scheduled, state.filed
        keyed = new.keyed
        # Each key is filed under the partition its message is written to (``cleanup.file_keys``),
        # worked out for them all in one call, as ``place`` did for the batch.
        numbers: list[int] = []
        if keyed:
            dues = np.fromiter((m.deliver_at_ms for _, m in keyed), np.int64, len(keyed))
            numbers = self.layout.keys_for(dues, now_ms).tolist()

        def on_written(positions: list[int]) -> None:
            for (key, message), number in zip(keyed, numbers, strict=True):
                dedupe[key] = message.id
                filed.setdefault(number, []).append(key)
                unwritten.pop(key, None)
            destinations = new.destinations
            first = destinations[0]
            if all(map(first.__eq__, destinations)):
                scheduled[first] += len(destinations)
            else:
                scheduled.update(destinations)
            rows = placed.rows
            for run, partition in enumerate(placed.partitions):
                partition.total += rows[run + 1] - rows[run]
                if partition.index is not None:
                    recent = placed.index(run, positions[run], new.messages, new.latest_sent_ms)
                    table.recent.update(recent)
            if len(table.recent) > RECENT_MAX:
                table.recent.clear()
            table.changes += len(destinations)

        try:
            await self.writer.append(placed.slices(), durable=True, on_written=on_written)
        except BaseException:
            for key, message in new.keyed:
                if unwritten.get(key) is message:
                    del unwritten[key]
            raise
