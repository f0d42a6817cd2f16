"""Finding a message's records without an id index: the id carries the due time it was made
with (``tarry.model.ids``), which names one partition; one ``bytes.find`` pass per segment of
that partition finds every record of the id (each candidate is checked as a whole record, so
an id that merely appears in some body is ignored). MOVED markers lead to the next partition.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterator
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
)
from tarry.store.sqlite.store import decode_cursor, page

if TYPE_CHECKING:
    from tarry.store.log.engine import LogStore

__all__ = ["Located", "list_page", "locate", "scan_partition"]


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


def _records_of(partition: Partition, message_id: str) -> Iterator[tuple[int, Record]]:
    needle = message_id.encode("ascii")
    for segment, data in _segments(partition):
        at = data.find(needle)
        while at >= 0:
            got = parse_record(data, at - HEADER) if at >= HEADER else None
            if isinstance(got, Record) and got.id == message_id:
                yield position(segment, at - HEADER), got
            at = data.find(needle, at + 1)


def locate(store: LogStore, message_id: str) -> Located | None:
    due = id_due_ms(message_id)
    if due is None:
        return None
    number = due // store.granularity_ms
    for _ in range(1000):  # a chain of reschedules, never a loop
        partition = store.partitions.get(number)
        if partition is None:
            return None
        found: tuple[int, Record] | None = None
        state = MessageState.SCHEDULED
        moved_to: int | None = None
        failures: tuple[int, str] | None = None
        for pos, record in _records_of(partition, message_id):
            if record.kind == FAILED:
                failures = record.failure()
            elif record.kind == MESSAGE:
                found, state, moved_to = (pos, record), MessageState.SCHEDULED, None
            elif record.kind == RELEASED:
                state = state_of_code(record.marker()[1])
            elif record.kind == CANCELLED:
                state = MessageState.CANCELLED
            elif record.kind == MOVED:
                moved_to = record.marker()[1]
        if moved_to is not None and moved_to // store.granularity_ms != number:
            number = moved_to // store.granularity_ms
            continue
        if found is None:
            return None
        message, _ = decode_message(found[1].payload)
        message.state = state
        if failures:
            message.failures, message.last_error = failures
        return Located(partition, found[0], message.deliver_at_ms, message)
    return None


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
    full, so a page never reads every partition."""
    after = decode_cursor(query.cursor) if query.cursor else None
    low = max(query.due_after_ms or 0, after[0] if after else 0)
    first = bisect.bisect_left(store._numbers, low // store.granularity_ms)
    selected: list[Message] = []
    loop = asyncio.get_running_loop()
    for number in list(store._numbers[first:]):
        partition = store.partitions.get(number)
        if partition is None:
            continue
        if query.due_before_ms is not None and partition.start_ms >= query.due_before_ms:
            break
        messages = await loop.run_in_executor(None, scan_partition, store, partition)
        messages.sort(key=lambda m: (m.deliver_at_ms, m.id))
        selected += [m for m in messages if query.matches(m, after)]
        if len(selected) > query.limit:
            break
    return page(selected, query.limit)
