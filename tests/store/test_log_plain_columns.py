"""A round's batch read as columns (``decode_plain_columns``): for any log of plain, keyed (a
``message_id``, a ``correlation_id`` or both), flagged and damaged records, it gives exactly what
the general decode (``decode_records`` with ``plain_row``) gives, column by column, when every
picked record is a whole, valid MESSAGE record, plain or keyed, and gives up (None, for the
general way to read and report) otherwise."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.model.message import Message, plain_message
from tarry.store.log.held import dedupe_hash
from tarry.store.log.record import (
    RELEASED,
    decode_plain_columns,
    decode_records,
    encode_markers,
    encode_message,
    plain_row,
)

_ID = st.text(alphabet="0123456789ABCDEFGHJKMNPQRSTVWXYZ", min_size=26, max_size=26)
_PLAIN = st.builds(
    lambda id_, destination, body, sent, due, expires: Message(
        id=id_,
        destination=destination,
        body=body,
        headers={},
        sent_at_ms=sent,
        deliver_at_ms=due,
        expires_at_ms=expires,
        updated_at_ms=sent,
    ),
    _ID,
    st.sampled_from(["q", "orders", "ünïcode-q", ""]),
    st.binary(max_size=40),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
    st.none() | st.integers(0, 2**40),
)
#: What a record of the log is: plain, keyed (a ``message_id`` with its hash, as the store
#: writes an idempotent producer's), correlated (a correlation id), both, flagged (headers; a
#: ``message_id`` and a reply queue), a marker, or damaged in one byte.
_KIND = st.sampled_from(
    [
        *("plain", "plain", "plain", "keyed", "keyed", "correlated", "both"),
        *("flagged", "replied", "marker", "flipped"),
    ]
)


def _record(message: Message, kind: str, flip_at: int) -> bytes:
    if kind == "keyed":
        keyed = replace(message, message_id=f"order-{flip_at}")
        return encode_message(keyed, dedupe_hash(keyed))
    if kind == "flagged":
        return encode_message(replace(message, headers={"h": "v"}))
    if kind == "correlated":
        return encode_message(replace(message, correlation_id=f'saga "{flip_at}"'))
    if kind == "both":
        both = replace(message, message_id="m", correlation_id="c")
        return encode_message(both, dedupe_hash(both))
    if kind == "replied":
        replied = replace(message, message_id="m", reply_to="replies")
        return encode_message(replied, dedupe_hash(replied))
    if kind == "marker":
        return encode_markers(RELEASED, 3, [(message.id, 0, message.destination)])
    record = bytearray(encode_message(message))
    if kind == "flipped":
        record[flip_at % len(record)] ^= 0x41
    return bytes(record)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_PLAIN, _KIND, st.integers(0, 200)), min_size=1, max_size=12),
    st.data(),
    st.integers(0, 3),
)
def test_columns_are_the_general_decode_or_nothing(
    records: list[tuple[Message, str, int]], data: st.DataObject, base_segment: int
) -> None:
    # Given a segment of records of every kind, and a batch picked from it in any order
    # (positions carry the segment's number above the offsets, as the store's do)
    parts = [_record(message, kind, flip_at) for message, kind, flip_at in records]
    buf = b"".join(parts)
    offsets = [sum(len(p) for p in parts[:k]) for k in range(len(parts))]
    picked = data.draw(st.lists(st.sampled_from(offsets), min_size=1, max_size=len(offsets)))
    cut = data.draw(st.integers(0, 4))  # sometimes the buffer ends inside the last record
    view = buf[: len(buf) - cut]
    base = base_segment << 40
    # When the batch is read as columns and the general way
    columns = decode_plain_columns(view, base, [base + offset for offset in picked])
    general = decode_records(view, picked, plain_row)
    # Then the columns are the general rows when every one is plain or keyed, else there are
    # none
    rows = [_as_row(read) for read in general]
    if all(row is not None for row in rows):
        assert columns is not None
        for k in (6, 7):  # each producer's id a column where a record has one, else None
            if all(row is not None and row[k] is None for row in rows):
                assert columns[k] is None
        message_ids, correlation_ids = (columns[k] or [None] * len(rows) for k in (6, 7))
        assert list(zip(*columns[:6], message_ids, correlation_ids, strict=True)) == rows
    else:
        assert columns is None


def _as_row(read: object) -> tuple[object, ...] | None:
    """What the general decode read, as a row of the columns with its producer's ids: a plain
    row, a keyed message (nothing else set), or None."""
    if isinstance(read, tuple):
        return (*read, None, None)
    if not isinstance(read, Message):
        return None
    fields = plain_row_of(read)
    ids = read.message_id, read.correlation_id
    if read != plain_message(*fields, message_id=ids[0], correlation_id=ids[1]):
        return None
    return (*fields, *ids)


def plain_row_of(message: Message) -> tuple[str, str, bytes, int, int, int | None]:
    return (
        message.id,
        message.destination,
        message.body,
        message.sent_at_ms,
        message.deliver_at_ms,
        message.expires_at_ms,
    )


def _orders_message() -> Message:
    return Message(
        id="0" * 26,
        destination="orders",
        body=b"one",
        headers={},
        sent_at_ms=5,
        deliver_at_ms=9,
        expires_at_ms=None,
    )


def test_a_batch_of_one_destination_reads_its_fields_back() -> None:
    # Given two plain messages, one expiring
    first = _orders_message()
    second = replace(first, id="1" * 26, body=b"", expires_at_ms=70)
    buf = encode_message(first) + encode_message(second)
    # When both are read as columns, the second first
    columns = decode_plain_columns(buf, 0, [len(encode_message(first)), 0])
    # Then each column holds their fields, in the order asked
    assert columns == (
        ["1" * 26, "0" * 26],
        ["orders", "orders"],
        [b"", b"one"],
        [5, 5],
        [9, 9],
        [70, None],
        None,
        None,
    )


def test_a_keyed_message_reads_its_message_id_beside_plain_ones() -> None:
    # Given a plain message and one an idempotent producer sent (a message_id, its hash)
    plain = _orders_message()
    keyed = replace(plain, id="1" * 26, message_id="order-7", body=b"two")
    buf = encode_message(plain) + encode_message(keyed, dedupe_hash(keyed))
    # When both are read as columns
    columns = decode_plain_columns(buf, 0, [0, len(encode_message(plain))])
    # Then the keyed one's body is its own (after the hash and the extra fields), and the
    # message ids are a column
    assert columns is not None
    assert columns[2] == [b"one", b"two"]
    assert columns[6] == [None, "order-7"]
