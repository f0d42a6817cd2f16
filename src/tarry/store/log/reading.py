"""Reading pending messages back: indexing partitions as they come near (``ensure_loaded``), and
reading the records of the messages a fetch or a release picked (``read_records``), damage
reported (``/healthz``) and left out, never delivered."""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import repeat
from typing import TypeVar, cast

from tarry.model.message import Message
from tarry.store.log.held import Held
from tarry.store.log.indexing import load
from tarry.store.log.partition import Partition, split
from tarry.store.log.record import MESSAGE, PlainReader, Record, decode_message
from tarry.store.log.scrub import damage_line
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable

__all__ = ["SYNC_RECORDS", "ensure_loaded", "pick_due", "read_message", "read_records"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A due partition with up to this many records is indexed by the round that finds it (a few
#: background steps' worth): its messages go in that round.
SYNC_RECORDS = 2_000


def ensure_loaded(
    table: PartitionTable, now_ms: int, ahead: Callable[[Partition], bool] | None = None
) -> None:
    """Index every partition with pending messages that starts within ``prefetch_ms``, after
    downtime a few overdue ones at a time, in due order. Given ``ahead`` (a build in the
    background, ``LogStore``), it takes every one still ahead, and a due one with more than
    ``SYNC_RECORDS`` records (one left to a background build misses the rounds until it is
    built, but the event loop is not held by it)."""
    horizon = now_ms + table.prefetch_ms
    overdue_indexed = 0
    for number in table.numbers:
        partition = table.partitions[number]
        if partition.start_ms > horizon:
            break
        partition.settle(now_ms)
        if partition.live <= 0:
            continue
        overdue = partition.end_ms <= now_ms
        if partition.index is None:
            if overdue_indexed >= 2 and overdue:
                break
            records = partition.total + partition.finished
            if ahead is not None and (partition.start_ms > now_ms or records > SYNC_RECORDS):
                if ahead(partition):
                    overdue_indexed += overdue
                    continue
                if partition.start_ms > now_ms:
                    continue  # its build failed: read all at once when it falls due
            load(table, partition)
        assert partition.index is not None
        if overdue and len(partition.index):
            overdue_indexed += 1


def pick_due(
    table: PartitionTable,
    files: SegmentFiles,
    now_ms: int,
    limit: int,
    ahead: Callable[[Partition], bool] | None = None,
) -> list[Held]:
    """Take up to ``limit`` messages due at ``now_ms`` out of circulation: waiting ones (retries,
    released claims) first, then the indexed partitions', in due order."""
    ensure_loaded(table, now_ms, ahead)
    partitions = table.partitions
    # The due partitions' bytes held in memory are written out before anything is taken
    # out of circulation: a failed write (a full disk) fails the fetch, losing nothing.
    due: list[Partition] = []
    for number in table.numbers:
        partition = partitions[number]
        if partition.start_ms > now_ms:
            break
        if partition.index is not None:
            files.flush(partition)
            due.append(partition)
    picked = [held for _, held in table.due_waiting(now_ms, limit)]
    for partition in due:
        if len(picked) >= limit:
            break
        assert partition.index is not None
        dues, poss = partition.index.pop_due(now_ms, limit - len(picked))
        picked += map(Held, repeat(partition.number), poss, dues, repeat(""))
    return picked


def read_message(table: PartitionTable, files: SegmentFiles, held: Held) -> Message | None:
    partition = table.partitions.get(held.number)
    if partition is None:
        return None
    got = files.read(partition, held.pos)
    if isinstance(got, Record) and got.kind == MESSAGE:
        return decode_message(got.payload)[0]
    _damaged(table, partition, held.pos, got if isinstance(got, str) else "not a message record")
    return None


def read_records(
    table: PartitionTable, files: SegmentFiles, helds: list[Held], plain: PlainReader[T]
) -> list[Message | T | None]:
    """``read_message`` of each, reading each partition's records in one go; a record without
    flags read by ``plain`` (``plain_message_of``, or ``plain_row`` for a release by
    columns)."""
    if not helds:
        return []
    number = helds[0].number
    if all(held.number == number for held in helds):  # a round's batch: mostly one partition
        partition = table.partitions.get(number)
        if partition is None:
            return [None] * len(helds)
        positions = [held.pos for held in helds]
        got = files.read_records(partition, positions, plain)
        if str not in set(map(type, got)):
            # A string type: ``list[Message | T | None]`` would be built at every call.
            return cast("list[Message | T | None]", got)
        return [_readable(table, partition, pos, g) for pos, g in zip(positions, got, strict=True)]
    out: list[Message | T | None] = [None] * len(helds)
    by_number: dict[int, list[int]] = {}
    for i, held in enumerate(helds):
        by_number.setdefault(held.number, []).append(i)
    for number, indexes in by_number.items():
        partition = table.partitions.get(number)
        if partition is None:
            continue
        positions = [helds[i].pos for i in indexes]
        got = files.read_records(partition, positions, plain)
        for i, pos, message in zip(indexes, positions, got, strict=True):
            out[i] = _readable(table, partition, pos, message)
    return out


def _readable(
    table: PartitionTable, partition: Partition, pos: int, got: Message | T | str
) -> Message | T | None:
    if not isinstance(got, str):
        return got
    _damaged(table, partition, pos, got)
    return None


def _damaged(table: PartitionTable, partition: Partition, pos: int, reason: str) -> None:
    """Never deliver garbage: the damaged message is reported and left out."""
    segment, offset = split(pos)
    line = damage_line(partition.segment_path(segment), offset, reason)
    if table.state.report(line):
        log.error("cannot read a message (%s); it is skipped", line)
