"""Records encoded column-wise (store/log/record_columns.py, what the offline import writes) are
byte for byte what ``encode_message`` writes for the same messages, and the store's reader
decodes them back; ids made column-wise are the ids ``new_due`` makes."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.model.ids import IdGenerator, id_due_ms
from tarry.model.message import Message, Report, Undeliverable
from tarry.store.log.held import dedupe_hash
from tarry.store.log.record import decode_message, encode_message, parse_record
from tarry.store.log.record_columns import (
    MessageColumns,
    dedupe_hashes,
    encode_message_columns,
    encode_plain_columns,
)
from tests.plain_columns import Row, columns_of, plain_rows

NOW = 1_800_000_000_000
_TEXT = st.one_of(st.none(), st.text(max_size=5), st.sampled_from(['a"b', "x\\y", "\n", "é"]))
_MESSAGES = st.builds(
    lambda i, dest, topic, due, exp, mid, cid, rto, rep, hdr, body, discard, persistent: Message(
        id=f"{i:026d}",
        destination=dest,
        topic=topic,
        body=body,
        headers=hdr,
        sent_at_ms=NOW,
        deliver_at_ms=due,
        expires_at_ms=exp,
        message_id=mid,
        correlation_id=cid,
        reply_to=rto,
        report=rep,
        on_undeliverable=Undeliverable.DISCARD if discard else Undeliverable.DEAD_LETTER,
        persistent=persistent,
    ),
    st.integers(0, 10**20),
    st.sampled_from(["q", "bench.q01", "s1"]),
    st.one_of(st.none(), st.just("t")),
    st.integers(0, 2**50),
    st.one_of(st.none(), st.integers(0, 2**50)),
    _TEXT.filter(lambda t: t != ""),
    _TEXT.filter(lambda t: t != ""),
    st.one_of(st.none(), st.just("replies")),
    st.sampled_from([frozenset(), frozenset({Report.EXPIRATION}), frozenset(Report)]),
    st.dictionaries(st.text(min_size=1, max_size=3), st.text(max_size=3), max_size=2),
    st.binary(max_size=40),
    st.booleans(),
    st.booleans(),
)


def _columns(messages: list[Message]) -> MessageColumns:
    def text(values: list[str | None]) -> pa.Array:
        return pa.array(values, pa.string())

    return MessageColumns(
        ids=np.array([m.id for m in messages], "S26"),
        destination=text([m.destination for m in messages]),
        topic=text([m.topic for m in messages]),
        due_ms=np.array([m.deliver_at_ms for m in messages], np.int64),
        sent_ms=NOW,
        expires_ms=pa.array([m.expires_at_ms for m in messages], pa.int64()),
        message_id=text([m.message_id for m in messages]),
        correlation_id=text([m.correlation_id for m in messages]),
        reply_to=text([m.reply_to for m in messages]),
        report=text([",".join(sorted(r.value for r in m.report)) or None for m in messages]),
        headers=text([orjson.dumps(m.headers).decode() if m.headers else None for m in messages]),
        body=pa.array([m.body for m in messages], pa.binary()),
        discard=np.array([m.on_undeliverable is Undeliverable.DISCARD for m in messages]),
        persistent=np.array([m.persistent for m in messages]),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_MESSAGES, min_size=1, max_size=8))
def test_column_wise_records_are_encode_message_byte_for_byte(messages: list[Message]) -> None:
    # Given messages as the offline import holds them, in columns
    columns = _columns(messages)
    # When encoded column-wise
    hashes = dedupe_hashes(columns.topic, columns.destination, columns.message_id)
    records = encode_message_columns(columns, hashes).to_pylist()
    # Then each record is encode_message's, and reads back as the message
    assert hashes.tolist() == [dedupe_hash(m) for m in messages]
    assert records == [encode_message(m, dedupe_hash(m)) for m in messages]
    for record, m in zip(records, messages, strict=True):
        parsed = parse_record(record, 0)
        assert not isinstance(parsed, str)
        decoded, key = decode_message(parsed.payload)
        assert (decoded.body, decoded.headers, decoded.message_id) == (
            m.body,
            m.headers,
            m.message_id,
        )


@settings(max_examples=100)
@given(st.lists(st.integers(0, 2**42 - 1), min_size=1, max_size=50), st.integers(0, 2**40))
def test_ids_made_column_wise_are_new_dues_ids(due: list[int], now: int) -> None:
    # Given two generators in the same state
    one, many = IdGenerator(), IdGenerator()
    one._random, many._random = random.Random(5), random.Random(5)
    # When one makes ids one at a time and the other all at once (twice, across a new ms)
    expected = [one.new_due(now, d) for d in due] + [one.new_due(now + 1, d) for d in due]
    got = many.new_due_many(now, np.array(due)).tolist()
    got += many.new_due_many(now + 1, np.array(due)).tolist()
    # Then they are the same ids, and carry the due times
    assert [g.decode() for g in got] == expected
    assert [id_due_ms(g.decode()) for g in got] == due + due


@settings(max_examples=100, deadline=None)
@given(plain_rows(NOW))
def test_plain_records_made_from_columns_are_encode_message_byte_for_byte(rows: list[Row]) -> None:
    # Given plain sends accepted as columns (the send path's common case)
    batch = columns_of(rows, NOW)
    # When their records are encoded from the columns
    records = encode_plain_columns(batch)
    # Then each is the record of the message they stand for, and reads back as it
    messages = list(batch.messages())
    assert records == [encode_message(m) for m in messages]
    for record, message in zip(records, messages, strict=True):
        parsed = parse_record(record, 0)
        assert not isinstance(parsed, str)
        assert decode_message(parsed.payload) == (message, 0)


@given(plain_rows(NOW), st.data())
def test_keyed_records_made_from_columns_are_encode_message_byte_for_byte(
    rows: list[Row], data: st.DataObject
) -> None:
    # Given plain sends accepted as columns, some with a message_id, some with a correlation
    # id (quotes, escapes and non-ASCII among them), and their de-duplication hashes
    ids = st.one_of(st.none(), st.text(min_size=1, max_size=6), st.sampled_from(['a"b', "\n"]))
    message_ids, correlation_ids = (
        data.draw(st.lists(ids, min_size=len(rows), max_size=len(rows))) for _ in range(2)
    )
    batch = columns_of(rows, NOW, message_ids, correlation_ids)
    messages = list(batch.messages())
    hashes = [dedupe_hash(m) for m in messages]
    # When their records are encoded from the columns
    records = encode_plain_columns(batch, hashes)
    # Then each is the record of the message they stand for, and reads back as it
    assert [m.message_id for m in messages] == message_ids
    assert [m.correlation_id for m in messages] == correlation_ids
    assert records == [encode_message(m, h) for m, h in zip(messages, hashes, strict=True)]
    for record, message, key in zip(records, messages, hashes, strict=True):
        parsed = parse_record(record, 0)
        assert not isinstance(parsed, str)
        assert decode_message(parsed.payload) == (message, key)
