"""The log store's record codec: a batch of markers framed at once reads back marker by
marker, each record checked (version, length, CRC) as any reader checks it; a batch of
messages encodes byte for byte as each message alone, and reads as each record alone."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

from tarry.model.ids import IdGenerator
from tarry.model.message import Death, DeathReason, Message, Report, Undeliverable
from tarry.store.log.record import (
    HEADER,
    MESSAGE,
    RELEASED,
    SHORT_HEADER,
    SHORT_RECORD,
    Record,
    _flagged_payload,
    _frame,
    decode_message,
    decode_records,
    encode_markers,
    encode_message,
    encode_messages,
    parse_record,
    plain_message_of,
    scan,
)
from tarry.store.log.record_walk import scan_ids


def test_markers_of_several_destinations_frame_like_single_markers() -> None:
    ids = IdGenerator()
    entries = [
        (ids.new(1_700_000_000_000 + i), i * 97, destination)
        for i, destination in enumerate(["q", "q", "ünïcode-q", "", "q", "ünïcode-q"])
    ]
    batch = encode_markers(RELEASED, 3, entries)
    # Each marker framed on its own by the generic framing (header and CRC of that marker).
    assert batch == b"".join(
        _frame(RELEASED, i.encode() + struct.pack("<qq", target, 3) + d.encode())
        for i, target, d in entries
    )
    records = list(scan(batch))
    assert all(isinstance(r, Record) for r in records)
    assert [(r.id, r.marker(), r.destination()) for r in records if isinstance(r, Record)] == [
        (i, (target, 3), d) for i, target, d in entries
    ]


def test_scan_ids_finds_only_the_ids_asked_for_and_passes_over_damage() -> None:
    ids = IdGenerator()
    entries = [(ids.new(1_700_000_000_000 + i), i, "q") for i in range(6)]
    records = [encode_markers(RELEASED, 1, [entry]) for entry in entries]
    damaged = bytearray(records[2])
    damaged[HEADER + 30] ^= 0xFF  # a payload byte: the record's checksum fails
    buf = b"".join([records[0], records[1], bytes(damaged), b"\x01garbage", *records[3:]])
    wanted = {entries[i][0].encode() for i in (1, 2, 4)}
    assert [r.id for r in scan_ids(buf, wanted)] == [entries[1][0], entries[4][0]]
    # A wanted id whose record is torn at the end of the log is not returned either.
    assert [r.id for r in scan_ids(records[4][:-3], {entries[4][0].encode()})] == []


def test_a_batch_of_messages_encodes_as_each_message_through_the_general_framing() -> None:
    # Given plain messages and messages with every kind of optional field (an empty topic
    # is absent, as a plain message has it)
    ids = IdGenerator()

    def message(i: int, **fields: Any) -> Message:
        return Message(
            id=ids.new(1_700_000_000_000 + i),
            destination=["q", "ünïcode-q", ""][i % 3],
            body=b"b" * (i % 5),
            sent_at_ms=1_700_000_000_000,
            deliver_at_ms=1_700_000_000_000 + i,
            expires_at_ms=None if i % 2 else 1_700_000_100_000,
            **{"headers": {}, **fields},
        )

    batch = [
        message(0),
        message(1, headers={"h": "v"}),
        message(2, topic=""),
        message(3, topic="t", message_id="m", correlation_id="c", reply_to="r"),
        message(4, report=frozenset({Report.EXPIRATION})),
        message(5, persistent=False),
        message(6, on_undeliverable=Undeliverable.DISCARD),
        message(7),
        message(8),
    ]
    hashes = [0, 0, 0, 0, 0, 0, 0, 12345, 0]
    # When they are encoded in one batch
    records = encode_messages(batch, hashes)
    # Then each record is the general framing of the message, and one message alone encodes
    # the same
    general = [_frame(MESSAGE, _flagged_payload(m, h)) for m, h in zip(batch, hashes, strict=True)]
    assert records == general
    assert records == [encode_message(m, h) for m, h in zip(batch, hashes, strict=True)]
    assert [decode_message(r[HEADER:])[0].id for r in records] == [m.id for m in batch]


def test_decode_messages_reads_each_record_as_parse_record_and_decode_message_do() -> None:
    # Given a log of plain and flagged messages, a marker, and damage of every kind
    ids = IdGenerator()
    plain = Message(
        id=ids.new(1),
        destination="q",
        body=b"body",
        headers={},
        sent_at_ms=1,
        deliver_at_ms=2,
        expires_at_ms=None,
        updated_at_ms=1,
    )
    flagged = replace(plain, id=ids.new(1), headers={"h": "v"}, message_id="m", expires_at_ms=9)
    other = replace(plain, id=ids.new(1), destination="ünïcode-q", body=b"")
    records = [
        encode_message(plain),
        encode_message(flagged),
        encode_markers(RELEASED, 3, [(plain.id, 0, "q")]),
        encode_message(other),
    ]
    buf = bytearray(b"".join(records))
    offsets = [sum(len(r) for r in records[:i]) for i in range(len(records))]
    bad_crc = bytearray(encode_message(plain))
    bad_crc[-1] ^= 1
    reserved = bytearray(encode_message(other))
    reserved[2] = 1  # a reserved byte set: the CRC no longer matches
    bad_version = bytearray(encode_message(plain))
    bad_version[0] = 9
    for damaged in (bad_crc, reserved, bad_version):
        offsets.append(len(buf))
        buf += damaged
    torn = encode_message(flagged)
    offsets.append(len(buf))
    buf += torn[:-2]  # a short record at the end
    offsets.append(len(buf) - 3)  # and a short header
    # When every offset is decoded at once
    got = decode_records(bytes(buf), offsets, plain_message_of)

    # Then each is what reading that record alone gives
    def alone(offset: int) -> Message | str:
        record = parse_record(bytes(buf), offset)
        if isinstance(record, str):
            return record
        return (
            decode_message(record.payload)[0] if record.kind == MESSAGE else "not a message record"
        )

    assert got == [alone(offset) for offset in offsets]
    assert got[:4] == [plain, flagged, "not a message record", other]
    assert got[4:] == ["checksum mismatch"] * 2 + ["bad header", SHORT_RECORD, SHORT_HEADER]


def test_a_redriven_message_keeps_its_deaths_through_the_record() -> None:
    # A dead letter sent back by a redrive is kept by the log store with its death history.
    ids = IdGenerator()
    message = Message(
        id=ids.new_due(1_000, 2_000),
        destination="orders",
        body=b"again",
        headers={"tarry-redriven-from": "01OLD"},
        sent_at_ms=1_000,
        deliver_at_ms=2_000,
        expires_at_ms=None,
        deaths=[
            Death(DeathReason.REJECTED, "orders", 900, 2, "orders"),
            Death(DeathReason.EXPIRED, "orders.eu", 500, 1, "orders.eu"),
        ],
    )
    [record] = encode_messages([message], [0])
    parsed = parse_record(record, 0)
    assert isinstance(parsed, Record)
    decoded, _ = decode_message(parsed.payload)
    assert decoded.deaths == message.deaths
    assert decoded.headers == message.headers
    # and a message without deaths has none after the round trip (the key is left out)
    plain = parse_record(encode_message(replace(message, deaths=[])), 0)
    assert isinstance(plain, Record)
    assert decode_message(plain.payload)[0].deaths == []
    assert b'"d"' not in plain.payload
