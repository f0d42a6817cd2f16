"""MESSAGE records (``record.py``'s layout) encoded for a whole batch at once, column by column:
the offline import writes millions of them, where ``encode_message``'s Python call per record is
the cost that matters. The bytes are the same as ``encode_message`` gives for each message (a
property test compares them), so the store reads them like any other record.

Fixed-width parts are numpy structured arrays; variable-width parts (destination, the extra
JSON, the body) are joined with ``pyarrow.compute.binary_join_element_wise``; only the CRC32C of
each record and the de-duplication hash take a call per record (no vectorised CRC32C or BLAKE2b
is at hand). Needs pyarrow (the ``spark`` extra).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import google_crc32c
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tarry.model.accepted import AcceptedColumns
from tarry.store.log.record import MESSAGE, VERSION

__all__ = [
    "MessageColumns",
    "dedupe_hashes",
    "encode_message_columns",
    "encode_plain_columns",
    "needs_json_escape",
]

_HASH, _EXTRA, _DISCARD, _TRANSIENT = 1, 2, 4, 8
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_FIXED = np.dtype(
    [("due", "<i8"), ("sent", "<i8"), ("expires", "<i8"), ("flags", "<u2"), ("dlen", "<u2")]
)
_HEAD8 = np.dtype([("version", "u1"), ("kind", "u1"), ("reserved", "<u2"), ("length", "<u4")])
#: A plain record's payload up to its destination: the id, then ``_FIXED``.
_PLAIN = np.dtype([("id", "S26"), *_FIXED.descr])
#: The extra JSON's keys, in ``encode_message``'s order.
_EXTRA_KEYS = ("t", "m", "c", "r", "p", "h")


@dataclass(frozen=True, slots=True)
class MessageColumns:
    """The messages to encode, one row each (all arrays of the same length)."""

    #: 26-character ids (``IdGenerator.new_due_many``), as ``S26``.
    ids: np.ndarray
    destination: pa.Array
    topic: pa.Array
    due_ms: np.ndarray
    sent_ms: int
    #: Null: never expires.
    expires_ms: pa.Array
    message_id: pa.Array
    correlation_id: pa.Array
    reply_to: pa.Array
    #: Comma-separated report names, sorted (null: none).
    report: pa.Array
    #: The headers as JSON text (null: none).
    headers: pa.Array
    body: pa.Array
    discard: np.ndarray
    persistent: np.ndarray


def dedupe_hashes(topic: pa.Array, destination: pa.Array, message_id: pa.Array) -> np.ndarray:
    """``held.dedupe_hash`` of each message (0 where there is no message_id)."""
    keys = pc.binary_join_element_wise(
        pc.fill_null(topic, ""), destination, message_id.cast(pa.string()), "\x1f"
    )
    # copying a fresh hasher costs less than making one per key (parameter parsing)
    fresh = hashlib.blake2b(digest_size=8)
    data, bounds = _values(keys)
    valid = _valid(keys).tolist()
    digests = []
    for a, b, ok in zip(bounds[:-1], bounds[1:], valid, strict=True):
        if ok:
            hasher = fresh.copy()
            hasher.update(data[a:b])
            digests.append(hasher.digest())
        else:
            digests.append(b"\0" * 8)
    values = np.frombuffer(b"".join(digests), "<u8") & np.uint64((1 << 63) - 1)
    values = np.where((values == 0) & _valid(message_id), 1, values)
    return values.astype(np.int64)


def _values(column: pa.Array) -> tuple[bytes, list[int]]:
    """The data bytes of a string/binary array and each value's bounds in them."""
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[
        column.offset : column.offset + len(column) + 1
    ]
    data = data_buffer.to_pybytes() if data_buffer is not None else b""
    return data, offsets.tolist()


def needs_json_escape(column: pa.Array) -> np.ndarray:
    """Which values of a string array hold a character JSON must escape (a control character,
    ``"`` or ``\\``): one pass of numpy over the array's bytes, not a regex per value."""
    n = len(column)
    column = column.cast(pa.string())
    _, offsets_buffer, data_buffer = column.buffers()
    out = np.zeros(n, bool)
    if data_buffer is None or n == 0:
        return out
    offsets = np.frombuffer(offsets_buffer, np.int32)[column.offset : column.offset + n + 1]
    data = np.frombuffer(data_buffer, np.uint8)[offsets[0] : offsets[-1]]
    hits = np.flatnonzero((data < 0x20) | (data == 0x22) | (data == 0x5C)) + offsets[0]
    out[np.searchsorted(offsets, hits, side="right") - 1] = True
    return out


def _valid(column: pa.Array) -> np.ndarray:
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _fixed(values: np.ndarray, width: int) -> pa.Array:
    data = np.ascontiguousarray(values).tobytes()
    return pa.Array.from_buffers(pa.binary(width), len(values), [None, pa.py_buffer(data)]).cast(
        pa.binary()
    )


def _extra(columns: MessageColumns) -> pa.Array:
    """The extra JSON of each message (``{"t":..., "m":..., ...}``, non-empty values only) as
    binary; empty where there is none."""
    n = len(columns.ids)
    values = {
        "t": columns.topic,
        "m": columns.message_id,
        "c": columns.correlation_id,
        "r": columns.reply_to,
        "p": columns.report,
    }
    pieces = []
    slow = np.zeros(n, bool)
    for key, column in values.items():
        # Empty text is left out of the extra JSON, and so is every row holding one.
        column = column.cast(pa.string())
        length = pc.fill_null(pc.binary_length(column), 1).to_numpy(zero_copy_only=False)
        slow |= (length == 0) | needs_json_escape(column)
        pieces.append(pc.binary_join_element_wise(f',"{key}":"', column, '"', ""))
    headers = pc.if_else(
        pc.equal(columns.headers, "{}"), pa.scalar(None, pa.string()), columns.headers
    )
    pieces.append(pc.binary_join_element_wise(',"h":', headers, ""))
    # '}' closes every row; the first ',' becomes '{' (a row without extras: '}' → empty below)
    joined = pc.binary_join_element_wise(*pieces, "}", "", null_handling="replace")
    extra = pc.if_else(
        pc.equal(joined, "}"),
        pa.scalar("", pa.string()),
        pc.binary_replace_slice(joined, start=0, stop=1, replacement="{"),
    )
    if slow.any():
        rows = np.flatnonzero(slow)
        texts = []
        for i in rows:
            item = {k: values[k][int(i)].as_py() for k in values}
            h = columns.headers[int(i)].as_py()
            item["h"] = orjson.loads(h) if h else None
            texts.append(orjson.dumps({k: v for k, v in item.items() if v}).decode())
        mask = np.zeros(n, bool)
        mask[rows] = True
        extra = pc.replace_with_mask(extra, pa.array(mask), pa.array(texts, pa.string()))
    return extra.cast(pa.binary())


def encode_message_columns(columns: MessageColumns, hashes: np.ndarray) -> pa.Array:
    """One framed MESSAGE record per message (binary), as ``encode_message(message, hash)``."""
    n = len(columns.ids)
    destination = columns.destination.cast(pa.binary())
    extra = _extra(columns)
    extra_len = pc.binary_length(extra).to_numpy(zero_copy_only=False).astype(np.int64)
    has_extra = extra_len > 0
    has_hash = hashes != 0
    flags = (
        np.where(has_hash, _HASH, 0)
        | np.where(has_extra, _EXTRA, 0)
        | np.where(columns.discard, _DISCARD, 0)
        | np.where(columns.persistent, 0, _TRANSIENT)
    )
    fixed = np.zeros(n, _FIXED)
    fixed["due"] = columns.due_ms
    fixed["sent"] = columns.sent_ms
    fixed["expires"] = pc.fill_null(columns.expires_ms, -1).to_numpy(zero_copy_only=False)
    fixed["flags"] = flags
    fixed["dlen"] = pc.binary_length(destination).to_numpy(zero_copy_only=False)
    empty = pa.scalar(b"", pa.binary())
    hash_part = pc.if_else(pa.array(has_hash), _fixed(hashes.astype("<i8"), 8), empty)
    extra_part = pc.if_else(
        pa.array(has_extra),
        pc.binary_join_element_wise(_fixed(extra_len.astype("<u4"), 4), extra, b""),
        empty,
    )
    payload = pc.binary_join_element_wise(
        _fixed(columns.ids, 26),
        _fixed(fixed, _FIXED.itemsize),
        destination,
        hash_part,
        extra_part,
        pc.fill_null(columns.body.cast(pa.binary()), b""),
        b"",
    )
    head = np.zeros(n, _HEAD8)
    head["version"], head["kind"] = VERSION, MESSAGE
    head["length"] = pc.binary_length(payload).to_numpy(zero_copy_only=False)
    head8 = _fixed(head, _HEAD8.itemsize)
    checked = pc.binary_join_element_wise(head8, payload, b"")
    crcs = np.array(_crcs(checked), "<u4")
    return pc.binary_join_element_wise(head8, _fixed(crcs, 4), payload, b"")


def _crcs(records: pa.Array) -> list[int]:
    """CRC32C of each value of a binary array."""
    data, bounds = _values(records)
    value = google_crc32c.value
    return [value(data[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def encode_plain_columns(batch: AcceptedColumns, hashes: list[int] | None = None) -> list[bytes]:
    """The MESSAGE record of each plain message of ``batch`` (no optional field but its
    producer's ids: a ``message_id`` with its de-duplication hash, ``hashes``, and a
    ``correlation_id``), as ``encode_message`` gives it: the fixed fields and headers of the
    whole batch packed by numpy, then a join and a CRC32C per record."""
    n = len(batch)
    names = {name: name.encode("utf-8") for name in set(batch.destination)}
    destinations = [names[name] for name in batch.destination]
    bodies = batch.body
    fixed = np.zeros(n, _PLAIN)
    fixed["id"] = batch.ids
    fixed["due"] = batch.deliver_at_ms
    fixed["sent"] = batch.sent_at_ms
    fixed["expires"] = batch.expires_at_ms
    fixed["dlen"] = np.fromiter(map(len, destinations), np.uint16, n)
    # A message's hash and extra JSON (``{"m": ..., "c": ...}``) go between its destination
    # and its body, as ``encode_message`` puts them.
    keyed = [b""] * n
    if batch.message_id is not None or batch.correlation_id is not None:
        message_ids = batch.message_id or [None] * n
        correlation_ids = batch.correlation_id or [None] * n
        keys = hashes or [0] * n
        flags = np.zeros(n, np.uint16)
        for k, (message_id, correlation_id) in enumerate(
            zip(message_ids, correlation_ids, strict=True)
        ):
            extra = {"m": message_id, "c": correlation_id}
            blob = orjson.dumps({name: value for name, value in extra.items() if value})
            if blob != b"{}":
                key = keys[k]
                flags[k] = _EXTRA | (_HASH if key else 0)
                keyed[k] = (_I64.pack(key) if key else b"") + _U32.pack(len(blob)) + blob
        fixed["flags"] = flags
    head = np.zeros(n, _HEAD8)
    head["version"], head["kind"] = VERSION, MESSAGE
    lengths = np.fromiter(map(len, bodies), np.int64, n) + np.fromiter(map(len, keyed), np.int64, n)
    head["length"] = fixed["dlen"] + lengths + _PLAIN.itemsize
    fixed_bytes, head_bytes = fixed.tobytes(), head.tobytes()
    width, head_width = _PLAIN.itemsize, _HEAD8.itemsize
    value, extend, crc_bytes = google_crc32c.value, google_crc32c.extend, _U32.pack
    # A batch's records mostly share a length: each header's CRC is worked out once.
    head_crcs: dict[bytes, int] = {}
    out: list[bytes] = []
    append = out.append
    for k in range(n):
        payload = fixed_bytes[k * width : (k + 1) * width] + destinations[k] + keyed[k] + bodies[k]
        head8 = head_bytes[k * head_width : (k + 1) * head_width]
        crc = head_crcs.get(head8)
        if crc is None:
            crc = head_crcs[head8] = value(head8)
        append(head8 + crc_bytes(extend(crc, payload)) + payload)
    return out
