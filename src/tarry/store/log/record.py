"""The on-disk record codec of the log store. Every byte a segment holds is a sequence of records:

    record   := header payload
    header   := version:u8 kind:u8 reserved:u16 length:u32 crc:u32          (12 bytes, little end.)
                crc = CRC32C(header[0:8] + payload)
    payload  := id:26 bytes ASCII  body-of-kind                            (id at offset 12)

    kind 1 MESSAGE   due_ms:i64 sent_ms:i64 expires_ms:i64 (-1 none) flags:u16
                     destination_len:u16 destination:UTF-8
                     [dedupe_hash:i64]            when flags & 1
                     [extra_len:u32 extra:JSON]   when flags & 2: {"t": topic, "m": message_id,
                                                  "c": correlation_id, "r": reply_to,
                                                  "p": report, "h": headers, "d": deaths
                                                  (a redriven dead letter's)} (non-empty only)
                     body: the rest
                     flags & 4: on_undeliverable = discard; flags & 8: not persistent
    kind 2 RELEASED  target:i64 (position of the MESSAGE record in this partition) state:i64
                     destination: UTF-8 (the rest; keeps per-destination counts without reads)
    kind 3 CANCELLED target:i64 at_ms:i64 destination
    kind 4 MOVED     target:i64 new_due_ms:i64 destination  (rescheduled: a MESSAGE copy with
                                                  the same id goes to the partition of new_due_ms)
    kind 5 FAILED    target:i64 retry_at_ms:i64 failures:u32 error:UTF-8

A position is ``segment_number << 40 | offset``. Markers (kinds 2-5) name their MESSAGE record
by position (replay applies them with arrays, not per-id lookups) and carry the id too (``GET``
finds every record of an id with one ``bytes.find`` over the partition's segments).

Readers check version, length and CRC on every record: a short or failing record at the end of
the last segment is a torn tail (cut on recovery); anywhere else it is damage, reported with the
file name and offset and skipped by resynchronising on the next valid header.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import google_crc32c
import orjson

from tarry.model.message import (
    Death,
    Message,
    Undeliverable,
    parse_reports,
    plain_message,
    reports_text,
)

__all__ = [
    "CANCELLED",
    "DESTINATION_AT",
    "FAILED",
    "FLAG_HASH",
    "HEAD",
    "HEADER",
    "ID_LEN",
    "MARK_FIELDS",
    "MAX_RECORD",
    "MESSAGE",
    "MESSAGE_FIELDS",
    "MOVED",
    "RELEASED",
    "VERSION",
    "Damage",
    "PlainColumns",
    "PlainReader",
    "PlainRow",
    "SHORT",
    "Record",
    "decode_message",
    "decode_plain_columns",
    "decode_records",
    "encode_marker",
    "encode_markers",
    "encode_message",
    "encode_messages",
    "parse_record",
    "plain_message_of",
    "plain_row",
    "resync",
    "scan",
]

VERSION = 1
MESSAGE, RELEASED, CANCELLED, MOVED, FAILED = 1, 2, 3, 4, 5
#: version, kind, (unused), payload length, CRC32C of the header's first 8 bytes and the payload.
HEAD = _HEAD = struct.Struct("<BBHII")
HEADER = _HEAD.size
ID_LEN = 26
_MSG = struct.Struct("<qqqHH")
_FIXED = ID_LEN + _MSG.size  # where a MESSAGE payload's destination starts
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_HASH, _EXTRA, _DISCARD, _TRANSIENT = 1, 2, 4, 8
_MARK = struct.Struct("<qq")
_FAIL = struct.Struct("<I")
#: The layout's parts ``record_walk.py`` reads in place: a MESSAGE payload's fixed fields after
#: the id (due, sent, expires, flags, destination length) and where its destination starts;
#: a marker's (target position, value) after the id; the flag of a de-duplication hash (an
#: int64 after the destination).
MESSAGE_FIELDS, DESTINATION_AT, MARK_FIELDS, FLAG_HASH = _MSG, _FIXED, _MARK, _HASH
#: Larger than any sane record: a length above it is damage, not a record.
MAX_RECORD = 64 * 1024 * 1024
_crc = google_crc32c.value
_extend = google_crc32c.extend
_HEAD8 = struct.Struct("<BBHI")


@dataclass(slots=True)  # not frozen: a frozen __init__ sets fields one by one, per message read
class Record:
    kind: int
    offset: int
    size: int
    payload: bytes

    @property
    def id(self) -> str:
        return self.payload[:ID_LEN].decode("ascii")

    def marker(self) -> tuple[int, int]:
        """(target position, value) of a marker record."""
        return _MARK.unpack_from(self.payload, ID_LEN)

    def failure(self) -> tuple[int, str]:
        (failures,) = _FAIL.unpack_from(self.payload, ID_LEN + _MARK.size)
        return failures, self.payload[ID_LEN + _MARK.size + _FAIL.size :].decode("utf-8", "replace")

    def destination(self) -> str:
        """The destination a RELEASED / CANCELLED / MOVED marker names."""
        return self.payload[ID_LEN + _MARK.size :].decode("utf-8")

    def meta(self) -> tuple[int, str, int]:
        """(due_ms, destination, dedupe_hash) of a MESSAGE record, without its body."""
        due, _, _, flags, destination, dedupe_hash, _, _ = _fields(self.payload)
        return due, destination, dedupe_hash

    def due_ms(self) -> int:
        return int(_MSG.unpack_from(self.payload, ID_LEN)[0])


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes that are not a valid record: ``torn`` when nothing valid follows (end of log)."""

    offset: int
    end: int
    torn: bool
    reason: str


def _frame(kind: int, payload: bytes) -> bytes:
    head = _HEAD8.pack(VERSION, kind, 0, len(payload))
    return head + _U32.pack(_extend(_crc(head), payload)) + payload


def encode_message(message: Message, dedupe_hash: int = 0) -> bytes:
    """A MESSAGE record: fixed fields packed, optional ones only when present (small records
    keep the disk near the raw message size)."""
    return encode_messages([message], [dedupe_hash])[0]


def encode_messages(messages: Sequence[Message], hashes: Sequence[int]) -> list[bytes]:
    """The MESSAGE record of each message (``hashes``: their de-duplication hashes, 0 for
    none), in one loop with the packers bound (a stored batch's records without a call per
    record). A plain message (every optional field at its default) is packed in one go, and
    its header with the header's CRC is worked out once per payload length, as
    ``encode_markers`` does: a batch mostly shares one, so a record costs one CRC call."""
    out: list[bytes] = []
    append = out.append
    pack, u32, extend, discard = _MSG.pack, _U32.pack, _extend, Undeliverable.DISCARD
    framing: dict[int, tuple[bytes, int]] = {}
    for message, dedupe_hash in zip(messages, hashes, strict=True):
        if (
            dedupe_hash
            or message.headers
            or message.topic
            or message.message_id
            or message.correlation_id
            or message.reply_to
            or message.report
            or message.deaths
            or not message.persistent
            or message.on_undeliverable is discard
        ):
            append(_frame(MESSAGE, _flagged_payload(message, dedupe_hash)))
            continue
        destination = message.destination.encode("utf-8")
        expires = message.expires_at_ms
        payload = (
            message.id.encode("ascii")
            + pack(
                message.deliver_at_ms,
                message.sent_at_ms,
                -1 if expires is None else expires,
                0,
                len(destination),
            )
            + destination
            + message.body
        )
        frame = framing.get(len(payload))
        if frame is None:
            header = _HEAD8.pack(VERSION, MESSAGE, 0, len(payload))
            frame = framing[len(payload)] = (header, _crc(header))
        header, crc = frame
        append(header + u32(extend(crc, payload)) + payload)
    return out


def _flagged_payload(message: Message, dedupe_hash: int) -> bytes:
    """The payload of a MESSAGE record with optional fields (flags say which are present)."""
    destination = message.destination.encode("utf-8")
    expires = -1 if message.expires_at_ms is None else message.expires_at_ms
    flags = 0
    parts = []
    if dedupe_hash:
        flags |= _HASH
        parts.append(_I64.pack(dedupe_hash))
    extra: dict[str, object] = {}
    for key, value in (
        ("t", message.topic),
        ("m", message.message_id),
        ("c", message.correlation_id),
        ("r", message.reply_to),
        ("p", reports_text(message.report)),
        ("h", message.headers),
        ("d", [d.to_dict() for d in message.deaths]),
    ):
        if value:
            extra[key] = value
    if extra:
        flags |= _EXTRA
        blob = orjson.dumps(extra)
        parts.append(_U32.pack(len(blob)))
        parts.append(blob)
    if message.on_undeliverable is Undeliverable.DISCARD:
        flags |= _DISCARD
    if not message.persistent:
        flags |= _TRANSIENT
    return b"".join(
        (
            message.id.encode("ascii"),
            _MSG.pack(message.deliver_at_ms, message.sent_at_ms, expires, flags, len(destination)),
            destination,
            *parts,
            message.body,
        )
    )


def encode_marker(
    kind: int,
    message_id: str,
    target: int,
    value: int,
    *,
    destination: str = "",
    failures: int = 0,
    error: str = "",
) -> bytes:
    if kind != FAILED:
        return encode_markers(kind, value, [(message_id, target, destination)])
    payload = message_id.encode("ascii") + _MARK.pack(target, value)
    payload += _FAIL.pack(failures) + error.encode("utf-8")[:2000]
    return _frame(kind, payload)


def encode_markers(kind: int, value: int, entries: Sequence[tuple[str, int, str]]) -> bytes:
    """Markers of one kind (RELEASED / CANCELLED / MOVED) and value, one for each (message id,
    target position, destination) of ``entries``, framed and joined for one append (a
    released batch's markers without a call per marker)."""
    parts: list[bytes] = []
    mark, u32 = _MARK.pack, _U32.pack
    # Ids have a fixed length, so a destination fixes the payload's length: its header and
    # the header's CRC are worked out once per destination (a batch mostly shares one).
    framing: dict[str, tuple[bytes, bytes, int]] = {}
    for message_id, target, destination in entries:
        frame = framing.get(destination)
        if frame is None:
            tail = destination.encode("utf-8")
            header = _HEAD8.pack(VERSION, kind, 0, ID_LEN + _MARK.size + len(tail))
            frame = framing[destination] = (header, tail, _crc(header))
        header, tail, crc = frame
        payload = message_id.encode("ascii") + mark(target, value) + tail
        parts += (header, u32(_extend(crc, payload)), payload)
    return b"".join(parts)


def _fields(payload: bytes) -> tuple[int, int, int, int, str, int, dict[str, Any], int]:
    """(due, sent, expires, flags, destination, dedupe_hash, extra, body offset)."""
    due, sent, expires, flags, dest_len = _MSG.unpack_from(payload, ID_LEN)
    at = ID_LEN + _MSG.size
    destination = payload[at : at + dest_len].decode("utf-8")
    at += dest_len
    dedupe_hash = 0
    if flags & _HASH:
        (dedupe_hash,) = _I64.unpack_from(payload, at)
        at += 8
    extra: dict[str, Any] = {}
    if flags & _EXTRA:
        (length,) = _U32.unpack_from(payload, at)
        extra = orjson.loads(payload[at + 4 : at + 4 + length])
        at += 4 + length
    return due, sent, expires, flags, destination, dedupe_hash, extra, at


#: A MESSAGE payload without flags as a row of ``DueColumns``: (id, destination, body, sent,
#: due, expires).
PlainRow = tuple[str, str, bytes, int, int, "int | None"]


def plain_row(payload: bytes, due: int, sent: int, expires: int, dest_len: int) -> PlainRow:
    """The fields of a MESSAGE payload without flags (as in ``encode_message``: every optional
    field at its default) as a row, without a ``Message`` (a release by columns)."""
    at = _FIXED + dest_len
    return (
        payload[:ID_LEN].decode("ascii"),
        payload[_FIXED:at].decode("utf-8"),
        payload[at:],
        sent,
        due,
        None if expires < 0 else expires,
    )


def plain_message_of(payload: bytes, due: int, sent: int, expires: int, dest_len: int) -> Message:
    """The message of a MESSAGE payload without flags (``plain_row``'s fields)."""
    return plain_message(*plain_row(payload, due, sent, expires, dest_len))


def decode_message(payload: bytes) -> tuple[Message, int]:
    """The message of a MESSAGE payload and its de-duplication hash (0: none)."""
    due, sent, expires, flags, dest_len = _MSG.unpack_from(payload, ID_LEN)
    if not flags:  # the common case
        return plain_message_of(payload, due, sent, expires, dest_len), 0
    due, sent, expires, flags, destination, dedupe_hash, extra, at = _fields(payload)
    message = Message(
        id=payload[:ID_LEN].decode("ascii"),
        destination=destination,
        body=payload[at:],
        headers=extra.get("h", {}),
        sent_at_ms=sent,
        deliver_at_ms=due,
        expires_at_ms=None if expires < 0 else expires,
        message_id=extra.get("m"),
        correlation_id=extra.get("c"),
        reply_to=extra.get("r"),
        report=parse_reports(extra.get("p")),
        on_undeliverable=Undeliverable.DISCARD if flags & _DISCARD else Undeliverable.DEAD_LETTER,
        persistent=not flags & _TRANSIENT,
        topic=extra.get("t"),
        deaths=[Death.from_dict(d) for d in extra.get("d", ())],
        updated_at_ms=sent,
    )
    return message, dedupe_hash


#: Why a read found no whole record where one was expected to end past the buffer: a memory
#: map made before the record was appended (read again from a fresh map), or a torn tail.
SHORT_HEADER = "short header"
SHORT_RECORD = "short record"
SHORT = frozenset({SHORT_HEADER, SHORT_RECORD})


def _bad_header(version: int, kind: int, length: int) -> bool:
    return version != VERSION or not MESSAGE <= kind <= FAILED or not ID_LEN <= length <= MAX_RECORD


#: A header and the fixed part of a MESSAGE payload after it, read in one go.
_MESSAGE_AT = struct.Struct("<BBHII26sqqqHH")


T = TypeVar("T")
#: What a MESSAGE payload without flags is read as (``plain_message_of``, ``plain_row``).
PlainReader = Callable[[bytes, int, int, int, int], T]


def decode_records(
    buf: bytes | mmap.mmap, offsets: Sequence[int], plain: PlainReader[T]
) -> list[Message | T | str]:
    """The message of the record at each of ``offsets`` of ``buf``, or why there is none
    (``parse_record``'s reasons, or "not a message record"), without a ``Record`` and two calls
    a record in between (most of what reading a due message cost). A whole, valid MESSAGE
    record (nearly every one) is read with one unpack of its header and fixed fields, its
    header's share of the CRC looked up by length (a batch's records mostly share one);
    anything else goes through ``_decode_at``, which tells why. A record without flags (the
    common case) is what ``plain`` makes of it."""
    out: list[Message | T | str] = []
    size = len(buf)
    unpack = _MESSAGE_AT.unpack_from
    head_crcs: dict[int, int] = {}
    for offset in offsets:
        if size - offset >= HEADER + _FIXED:
            version, kind, reserved, length, crc, _, due, sent, expires, flags, dest_len = unpack(
                buf, offset
            )
            end = offset + HEADER + length
            if (
                version == VERSION
                and kind == MESSAGE
                and not reserved
                and _FIXED <= length <= MAX_RECORD
                and end <= size
            ):
                head_crc = head_crcs.get(length)
                if head_crc is None:
                    head_crc = head_crcs[length] = _crc(_HEAD8.pack(VERSION, MESSAGE, 0, length))
                payload = buf[offset + HEADER : end]
                if _extend(head_crc, payload) == crc:
                    if flags:
                        out.append(decode_message(payload)[0])
                    else:
                        out.append(plain(payload, due, sent, expires, dest_len))
                    continue
        out.append(_decode_at(buf, offset))
    return out


#: Plain MESSAGE records read as the columns of ``DueColumns``: (ids, destinations, bodies,
#: sent, due, expires, message ids, correlation ids), row ``k`` of each being what
#: ``plain_row`` reads of record ``k``; each of the producer's ids None when no record has one.
PlainColumns = tuple[
    list[str],
    list[str],
    list[bytes],
    list[int],
    list[int],
    list["int | None"],
    list["str | None"] | None,
    list["str | None"] | None,
]
#: The producer's ids, the only optional fields a plain record's extra JSON may hold.
_PRODUCER_IDS = frozenset({"m", "c"})


def decode_plain_columns(
    buf: bytes | mmap.mmap, base: int, positions: Sequence[int]
) -> PlainColumns | None:
    """``decode_records`` with ``plain_row`` of the records at ``positions`` less ``base`` (a
    round's batch, all in one segment), as columns, when every one is a whole, valid MESSAGE
    record without flags, or with its producer's ids alone (``message_id`` and its hash,
    ``correlation_id``; nearly every round); None as soon as one is not (damaged, other
    fields, past the buffer), for the caller to read the batch the general way, which tells
    why. Written into the columns in one loop: no row tuple, no
    call per record, and the destination (a batch mostly shares one) decoded once."""
    size = len(buf)
    unpack = _MESSAGE_AT.unpack_from
    head_crcs: dict[int, int] = {}
    names: dict[bytes, str] = {}
    raw_ids: list[bytes] = []
    destinations: list[str] = []
    bodies: list[bytes] = []
    sent_at: list[int] = []
    due_at: list[int] = []
    expires_at: list[int | None] = []
    message_ids: list[str | None] = []
    correlation_ids: list[str | None] = []
    keyed = correlated = False
    for position in positions:
        offset = position - base
        if size - offset < HEADER + _FIXED:
            return None
        version, kind, reserved, length, crc, raw_id, due, sent, expires, flags, dest_len = unpack(
            buf, offset
        )
        end = offset + HEADER + length
        if (
            version != VERSION
            or kind != MESSAGE
            or reserved
            or flags & ~(_HASH | _EXTRA)
            or (flags and not flags & _EXTRA)
            or not _FIXED <= length <= MAX_RECORD
            or end > size
        ):
            return None
        head_crc = head_crcs.get(length)
        if head_crc is None:
            head_crc = head_crcs[length] = _crc(_HEAD8.pack(VERSION, MESSAGE, 0, length))
        payload = buf[offset + HEADER : end]
        if _extend(head_crc, payload) != crc:
            return None
        at = _FIXED + dest_len
        raw = payload[_FIXED:at]
        name = names.get(raw)
        if name is None:
            name = names[raw] = raw.decode("utf-8")
        message_id = correlation_id = None
        if flags:  # a hash maybe, then the extra fields: the producer's ids, or the general way
            if flags & _HASH:
                at += 8
            (extra_len,) = _U32.unpack_from(payload, at)
            extra = orjson.loads(payload[at + 4 : at + 4 + extra_len])
            if not _PRODUCER_IDS.issuperset(extra):
                return None
            message_id, correlation_id = extra.get("m"), extra.get("c")
            at += 4 + extra_len
            keyed |= message_id is not None
            correlated |= correlation_id is not None
        message_ids.append(message_id)
        correlation_ids.append(correlation_id)
        raw_ids.append(raw_id)
        destinations.append(name)
        bodies.append(payload[at:])
        sent_at.append(sent)
        due_at.append(due)
        expires_at.append(None if expires < 0 else expires)
    ids = b"".join(raw_ids).decode("ascii")
    return (
        [ids[k : k + ID_LEN] for k in range(0, len(ids), ID_LEN)],
        destinations,
        bodies,
        sent_at,
        due_at,
        expires_at,
        message_ids if keyed else None,
        correlation_ids if correlated else None,
    )


def _decode_at(buf: bytes | mmap.mmap, offset: int) -> Message | str:
    """``decode_records`` of one record, any record: the message, or why there is none."""
    size = len(buf)
    if size - offset < HEADER:
        return SHORT_HEADER
    version, kind, _, length, crc = _HEAD.unpack_from(buf, offset)
    end = offset + HEADER + length
    if _bad_header(version, kind, length):
        return "bad header"
    if end > size:
        return SHORT_RECORD
    payload = buf[offset + HEADER : end]
    if _extend(_crc(buf[offset : offset + 8]), payload) != crc:
        return "checksum mismatch"
    if kind != MESSAGE:
        return "not a message record"
    return decode_message(payload)[0]


def parse_record(buf: bytes | memoryview | mmap.mmap, offset: int) -> Record | str:
    """The record at ``offset`` of ``buf``, or why there is none (short / bad header / crc)."""
    if len(buf) - offset < HEADER:
        return SHORT_HEADER
    version, kind, _, length, crc = _HEAD.unpack_from(buf, offset)
    if _bad_header(version, kind, length):
        return "bad header"
    end = offset + HEADER + length
    if end > len(buf):
        return SHORT_RECORD
    payload = bytes(buf[offset + HEADER : end])
    if _extend(_crc(bytes(buf[offset : offset + 8])), payload) != crc:
        return "checksum mismatch"
    return Record(kind, offset, HEADER + length, payload)


def scan(buf: bytes, start: int = 0) -> Iterator[Record | Damage]:
    """Every record from ``start``; damage is reported once per damaged stretch, then the scan
    resynchronises on the next offset that holds a valid record."""
    offset, size = start, len(buf)
    while offset < size:
        got = parse_record(buf, offset)
        if isinstance(got, Record):
            yield got
            offset += got.size
            continue
        resume = resync(buf, offset + 1)
        yield Damage(offset, resume, resume >= size, got)
        offset = resume


def resync(buf: bytes, offset: int) -> int:
    marker = bytes([VERSION])
    size = len(buf)
    while True:
        found = buf.find(marker, offset)
        if found < 0:
            return size
        if isinstance(parse_record(buf, found), Record):
            return found
        offset = found + 1
