"""A round's batch read as columns (``decode_plain_columns``): for any log of plain, flagged
and damaged records, it gives exactly what the general decode (``decode_records`` with
``plain_row``) gives, column by column, when every picked record is a whole, valid, plain
MESSAGE record, and gives up (None, for the general way to read and report) otherwise."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.model.message import Message
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
#: What a record of the log is: plain, flagged (headers), a marker, or damaged in one byte.
_KIND = st.sampled_from(["plain", "plain", "plain", "flagged", "marker", "flipped"])


def _record(message: Message, kind: str, flip_at: int) -> bytes:
    if kind == "flagged":
        return encode_message(replace(message, headers={"h": "v"}))
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
    # Then the columns are the general rows when every one is plain, else there are none
    if all(type(row) is tuple for row in general):
        assert columns is not None
        assert list(zip(*columns, strict=True)) == general
    else:
        assert columns is None


def test_a_batch_of_one_destination_reads_its_fields_back() -> None:
    # Given two plain messages, one expiring
    first = Message(
        id="0" * 26,
        destination="orders",
        body=b"one",
        headers={},
        sent_at_ms=5,
        deliver_at_ms=9,
        expires_at_ms=None,
    )
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
    )
