"""Finding a message's records without an id index: the id carries the due time it was made
with (``tarry.model.ids``), which names one partition; one ``bytes.find`` pass per segment of
that partition finds every record of the id (each candidate is checked as a whole record, so
an id that merely appears in some body is ignored). Partitions of several levels may cover one
due time (``layout.py``): each that exists is read. MOVED markers lead to the next ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tarry.model.ids import id_due_ms
from tarry.model.message import Message
from tarry.model.query import MessageQuery
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
)
from tarry.store.log.record_walk import scan_ids
from tarry.store.sqlite.store import decode_cursor, early_cursor, page

if TYPE_CHECKING:
    from tarry.store.log.table import PartitionTable

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


def locate_many(table: PartitionTable, message_ids: Iterable[str]) -> dict[str, Located]:
    """Each of ``message_ids`` that the store holds, found with one read of each partition the
    ids name (a batch of repeated sends costs a pass per partition, not one per message)."""
    forwards = table.state.forwards
    wanted: dict[int, set[str]] = {}
    seen: set[tuple[int, str]] = set()

    def want(due: int, message_id: str) -> None:
        for partition in table.holding(due):
            if (partition.number, message_id) not in seen:
                seen.add((partition.number, message_id))
                wanted.setdefault(partition.number, set()).add(message_id)

    for message_id in message_ids:
        # A rescheduled message is read where its latest copy is: the partition its id names
        # (with the MOVED marker) may have been cleaned up since.
        due = forwards.get(message_id) or id_due_ms(message_id)
        if due is not None:
            want(due, message_id)
    located: dict[str, Located] = {}
    while wanted:  # a chain of reschedules ends: each (partition, id) is read once
        reading, wanted = wanted, {}
        for number, ids in reading.items():
            partition = table.partitions.get(number)
            if partition is None:
                continue
            with contextlib.suppress(OSError):  # a full disk: the files hold what they hold
                table.flush(partition)
            for message_id, records in _records_of(partition, ids - located.keys()).items():
                trail = _Trail()
                for pos, record in records:
                    trail.follow(pos, record)
                if trail.moved_to is not None:
                    want(trail.moved_to, message_id)
                elif (found := trail.located(partition)) is not None:
                    located[message_id] = found
    return located


def scan_partition(partition: Partition) -> list[Message]:
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


async def list_page(table: PartitionTable, query: MessageQuery) -> tuple[list[Message], str | None]:
    """One page of ``GET /v1/messages`` from the log store: partitions are read in order of
    their start from the first the query (or its cursor) can touch, and reading stops once the
    page is full and the next partition starts after the page's last due time (a coarse
    partition may hold messages due after a finer one's), so a page never reads every one.
    A page also stops once ``SCAN_RECORDS_PER_PAGE`` messages were read: it then has the
    matches due before the next partition's start (every one of those was read) and an
    ``early_cursor`` from there."""
    after = decode_cursor(query.cursor) if query.cursor else None
    low = max(query.due_after_ms or 0, after[0] if after else 0)
    selected: list[Message] = []
    read = 0
    loop = asyncio.get_running_loop()
    for number in table.reaching(low):
        partition = table.partitions.get(number)
        if partition is None:
            continue
        if query.due_before_ms is not None and partition.start_ms >= query.due_before_ms:
            break
        if len(selected) > query.limit:
            selected.sort(key=lambda m: (m.deliver_at_ms, m.id))
            if partition.start_ms > selected[query.limit].deliver_at_ms:
                break
        if read >= SCAN_RECORDS_PER_PAGE and partition.start_ms > low:
            # Unread partitions hold only messages due from their start on.
            read_to = partition.start_ms
            kept = sorted(
                (m for m in selected if m.deliver_at_ms < read_to),
                key=lambda m: (m.deliver_at_ms, m.id),
            )
            if len(kept) > query.limit:
                return page(kept, query.limit)
            return kept, early_cursor(read_to)
        with contextlib.suppress(OSError):
            table.flush(partition)
        messages = await loop.run_in_executor(None, scan_partition, partition)
        selected += [m for m in messages if query.matches(m, after)]
        read += len(messages)
    selected.sort(key=lambda m: (m.deliver_at_ms, m.id))
    return page(selected, query.limit)
