"""Walks over a stretch of records that read their headers and a few fixed fields in place,
without a ``Record`` object each (``record.py``'s layout): what reads every record of a
partition (finding ids, building an index) pays a header read a record, not an object. Bytes
that are not a valid record end the fast walk; ``scan`` and ``resync`` deal with them.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterator

import google_crc32c

from tarry.store.log.record import (
    DESTINATION_AT,
    FAILED,
    FLAG_HASH,
    HEAD,
    HEADER,
    ID_LEN,
    MARK_FIELDS,
    MAX_RECORD,
    MESSAGE,
    MESSAGE_FIELDS,
    VERSION,
    Record,
    parse_record,
    resync,
)

__all__ = [
    "IndexEntries",
    "ReplayEntries",
    "index_walk",
    "replay_walk",
    "scan_ids",
    "valid_records",
]

#: A MESSAGE payload's due time and a marker's target position: the first field past the id.
_FIRST_FIELD = struct.Struct("<q")


def scan_ids(buf: bytes, ids: Collection[bytes]) -> Iterator[Record]:
    """The records of ``ids`` (ASCII), in log order: a walk over the headers that checks only
    those records whole (a partition's other records cost a header read, not a checksum);
    damage is passed over as ``scan`` does."""
    offset, size, head = 0, len(buf), HEAD.unpack_from
    while offset + HEADER <= size:
        version, kind, _, length, _ = head(buf, offset)
        # ``_bad_header`` inlined: this test runs once for every record of a partition.
        if (
            version == VERSION
            and MESSAGE <= kind <= FAILED
            and ID_LEN <= length <= MAX_RECORD
            and offset + HEADER + length <= size
        ):
            if buf[offset + HEADER : offset + HEADER + ID_LEN] in ids:
                got = parse_record(buf, offset)
                if isinstance(got, Record):
                    yield got
                    offset += got.size
                    continue
            else:
                offset += HEADER + length
                continue
        offset = resync(buf, offset + 1)


class IndexEntries:
    """What ``index_walk`` found: the due times and offsets of MESSAGE records, and the target
    positions of RELEASED, CANCELLED and MOVED markers (the messages they finished)."""

    __slots__ = ("due", "gone", "offsets", "records")

    def __init__(self) -> None:
        self.due: list[int] = []
        self.offsets: list[int] = []
        self.gone: list[int] = []
        #: Valid records walked (FAILED ones too).
        self.records = 0


def valid_records(buf: bytes, offset: int) -> Iterator[tuple[int, int, int]]:
    """(kind, offset, end) of each whole record from ``offset`` that passes ``parse_record``'s
    checks (header, length, CRC32C), up to the end of ``buf`` or the first bytes that are not
    one; a caller that stops early resumes from the last ``end`` it took."""
    head, crc, extend = HEAD.unpack_from, google_crc32c.value, google_crc32c.extend
    size = len(buf)
    while offset + HEADER <= size:
        version, kind, _, length, check = head(buf, offset)
        end = offset + HEADER + length
        if (
            version != VERSION
            or not MESSAGE <= kind <= FAILED
            or not ID_LEN <= length <= MAX_RECORD
            or end > size
            or extend(crc(buf[offset : offset + 8]), buf[offset + HEADER : end]) != check
        ):
            return
        yield kind, offset, end
        offset = end


def index_walk(buf: bytes, offset: int, records: int, into: IndexEntries) -> int:
    """Walk up to ``records`` whole, valid records from ``offset`` (``valid_records``), adding
    their entries to ``into``; returns where it stopped (the end of ``buf``, or bytes that are
    not a valid record)."""
    first = _FIRST_FIELD.unpack_from
    due, offsets, gone = into.due, into.offsets, into.gone
    walked = 0
    for kind, at, end in valid_records(buf, offset):
        if walked == records:
            break
        if kind == MESSAGE:
            due.append(first(buf, at + HEADER + ID_LEN)[0])
            offsets.append(at)
        elif kind != FAILED:
            gone.append(first(buf, at + HEADER + ID_LEN)[0])
        offset = end
        walked += 1
    into.records += walked
    return offset


class ReplayEntries:
    """What ``replay_walk`` found (``recovery.replay`` applies it): MESSAGE records' due times
    and offsets, their count, their de-duplication keys (hash, id) in log order; markers'
    target positions and count; each destination's messages less its markers; and the
    changes by id, in log order: (kind, id, value, offset) of each marker and FAILED record."""

    __slots__ = ("changes", "counts", "due", "finished", "gone", "keyed", "messages", "offsets")

    def __init__(self) -> None:
        self.due: list[int] = []
        self.offsets: list[int] = []
        self.messages = 0
        self.keyed: list[tuple[int, bytes]] = []
        self.gone: list[int] = []
        self.finished = 0
        self.counts: dict[bytes, int] = {}
        self.changes: list[tuple[int, bytes, int, int]] = []

    @property
    def records(self) -> int:
        return self.messages + len(self.changes)


def replay_walk(buf: bytes, offset: int, into: ReplayEntries) -> int:
    """Walk the whole, valid records from ``offset`` (``valid_records``), adding what recovery
    needs of them to ``into``; returns where it stopped (the end of ``buf``, or bytes that are
    not a valid record)."""
    fields, mark = MESSAGE_FIELDS.unpack_from, MARK_FIELDS.unpack_from
    hash_at = _FIRST_FIELD.unpack_from
    due, offsets, keyed, gone = into.due, into.offsets, into.keyed, into.gone
    counts, changes = into.counts, into.changes
    messages, finished = 0, 0
    for kind, at, end in valid_records(buf, offset):
        payload = at + HEADER
        if kind == MESSAGE:
            due_ms, _, _, flags, length = fields(buf, payload + ID_LEN)
            start = payload + DESTINATION_AT
            destination = buf[start : start + length]
            counts[destination] = counts.get(destination, 0) + 1
            if flags & FLAG_HASH:
                (key,) = hash_at(buf, start + length)
                if key:
                    keyed.append((key, buf[payload : payload + ID_LEN]))
            due.append(due_ms)
            offsets.append(at)
            messages += 1
        else:
            target, value = mark(buf, payload + ID_LEN)
            if kind != FAILED:
                destination = buf[payload + ID_LEN + MARK_FIELDS.size : end]
                counts[destination] = counts.get(destination, 0) - 1
                gone.append(target)
                finished += 1
            changes.append((kind, buf[payload : payload + ID_LEN], value, at))
        offset = end
    into.messages += messages
    into.finished += finished
    return offset
