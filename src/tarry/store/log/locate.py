"""Finding a message's records without an id index: the id carries the due time it was made
with (``tarry.model.ids``), which names one partition; one ``bytes.find`` pass per segment of
that partition finds every record of the id (each candidate is checked as a whole record, so
an id that merely appears in some body is ignored). MOVED markers lead to the next partition.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tarry.engine.types import MessageQuery
from tarry.model.ids import id_due_ms
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log.held import state_of_code
from tarry.store.log.partition import Partition, position
from tarry.store.log.record import (
    CANCELLED,
    FAILED,
    HEADER,
    MESSAGE,
    MOVED,
    RELEASED,
    Record,
    decode_message,
    parse_record,
    scan,
    scan_ids,
)
from tarry.store.sqlite.store import decode_cursor, early_cursor, page

if TYPE_CHECKING:
    from tarry.store.log.engine import LogStore

__all__ = ["SCAN_RECORDS_PER_PAGE", "Located", "list_page", "locate_many", "scan_partition"]

#: A page reads whole partitions until it is full or has read this many messages; then it ends
#: early, with what it found and a cursor past the last partition read (``early_cursor``): a
#: filter that matches rarely (a correlation id, a quiet destination) costs bounded time per
#: page instead of a read of every partition.
SCAN_RECORDS_PER_PAGE = 5_000


@dataclass
class Located:
    partition: Partition
    pos: int
    due: int
    message: Message


def _segments(partition: Partition) -> Iterator[tuple[int, bytes]]:
    for segment, size in enumerate(list(partition.written)):
        try:
            with open(partition.segment_path(segment), "rb") as handle:
                yield segment, handle.read(size)
        except FileNotFoundError:
            continue


#: Up to this many ids wanted in one partition, each is found with ``bytes.find``; more, and
#: one ``scan_ids`` walk over the partition's record headers is cheaper than a pass per id.
_FIND_MAX = 8


def _records_of(partition: Partition, ids: set[str]) -> dict[str, list[tuple[int, Record]]]:
    """Every record of each of ``ids`` in ``partition``, in log order (positions with them)."""
    found: dict[str, list[tuple[int, Record]]] = {}
    needles = {message_id.encode("ascii"): message_id for message_id in ids}
    for segment, data in _segments(partition):
        if len(needles) > _FIND_MAX:
            for record in scan_ids(data, needles.keys()):
                found.setdefault(record.id, []).append((position(segment, record.offset), record))
            continue
        for needle, message_id in needles.items():
            at = data.find(needle)
            while at >= 0:
                got = parse_record(data, at - HEADER) if at >= HEADER else None
                if isinstance(got, Record) and got.id == message_id:
                    found.setdefault(message_id, []).append((position(segment, at - HEADER), got))
                at = data.find(needle, at + 1)
    return found


@dataclass
class _Trail:
    """What one partition's records of an id say, read in log order."""

    found: tuple[int, Record] | None = None
    state: MessageState = MessageState.SCHEDULED
    moved_to: int | None = None
    failures: tuple[int, str] | None = None

    def follow(self, pos: int, record: Record) -> None:
        if record.kind == FAILED:
            self.failures = record.failure()
        elif record.kind == MESSAGE:
            self.found, self.state, self.moved_to = (pos, record), MessageState.SCHEDULED, None
        elif record.kind == RELEASED:
            self.state = state_of_code(record.marker()[1])
        elif record.kind == CANCELLED:
            self.state = MessageState.CANCELLED
        elif record.kind == MOVED:
            self.moved_to = record.marker()[1]

    def located(self, partition: Partition) -> Located | None:
        if self.found is None:
            return None
        pos, record = self.found
        message, _ = decode_message(record.payload)
        message.state = self.state
        if self.failures:
            message.failures, message.last_error = self.failures
        return Located(partition, pos, message.deliver_at_ms, message)


def locate_many(store: LogStore, message_ids: Iterable[str]) -> dict[str, Located]:
    """Each of ``message_ids`` that the store holds, found with one read of each partition the
    ids name (a batch of repeated sends costs a pass per partition, not one per message)."""
    granularity = store.granularity_ms
    forwards = store.state.forwards
    wanted: dict[int, set[str]] = {}
    for message_id in message_ids:
        # A rescheduled message is read where its latest copy is: the partition its id names
        # (with the MOVED marker) may have been cleaned up since.
        due = forwards.get(message_id) or id_due_ms(message_id)
        if due is not None:
            wanted.setdefault(due // granularity, set()).add(message_id)
    located: dict[str, Located] = {}
    for _ in range(1000):  # a chain of reschedules, never a loop
        if not wanted:
            break
        moved: dict[int, set[str]] = {}
        for number, ids in wanted.items():
            partition = store.partitions.get(number)
            if partition is None:
                continue
            for message_id, records in _records_of(partition, ids).items():
                trail = _Trail()
                for pos, record in records:
                    trail.follow(pos, record)
                if trail.moved_to is not None and trail.moved_to // granularity != number:
                    moved.setdefault(trail.moved_to // granularity, set()).add(message_id)
                elif (found := trail.located(partition)) is not None:
                    located[message_id] = found
        wanted = moved
    return located


def scan_partition(store: LogStore, partition: Partition) -> list[Message]:
    """Every message whose current record is in ``partition``, with its state (for listing)."""
    messages: dict[str, Message] = {}
    for _, data in _segments(partition):
        for item in scan(data):
            if not isinstance(item, Record):
                continue
            if item.kind == MESSAGE:
                message, _ = decode_message(item.payload)
                messages[message.id] = message
            elif item.kind == MOVED:
                messages.pop(item.id, None)
            elif item.kind == FAILED and item.id in messages:
                messages[item.id].failures, messages[item.id].last_error = item.failure()
            elif item.kind in (RELEASED, CANCELLED) and item.id in messages:
                messages[item.id].state = (
                    MessageState.CANCELLED
                    if item.kind == CANCELLED
                    else state_of_code(item.marker()[1])
                )
    return list(messages.values())


async def list_page(store: LogStore, query: MessageQuery) -> tuple[list[Message], str | None]:
    """One page of ``GET /v1/messages`` from the log store: partitions are read in due order
    from the first the query (or its cursor) can touch, and reading stops once the page is
    full or ``SCAN_RECORDS_PER_PAGE`` messages were read, so a page never reads every
    partition (an early end has fewer items and an ``early_cursor``)."""
    after = decode_cursor(query.cursor) if query.cursor else None
    low = max(query.due_after_ms or 0, after[0] if after else 0)
    numbers = list(
        store._numbers[bisect.bisect_left(store._numbers, low // store.granularity_ms) :]
    )
    selected: list[Message] = []
    read = 0
    loop = asyncio.get_running_loop()
    for at, number in enumerate(numbers):
        partition = store.partitions.get(number)
        if partition is None:
            continue
        if query.due_before_ms is not None and partition.start_ms >= query.due_before_ms:
            break
        messages = await loop.run_in_executor(None, scan_partition, store, partition)
        messages.sort(key=lambda m: (m.deliver_at_ms, m.id))
        selected += [m for m in messages if query.matches(m, after)]
        read += len(messages)
        if len(selected) > query.limit:
            break
        if read >= SCAN_RECORDS_PER_PAGE and at + 1 < len(numbers):
            return selected, early_cursor(partition.end_ms)
    return page(selected, query.limit)
