"""The log store's record codec: a batch of markers framed at once reads back marker by
marker, each record checked (version, length, CRC) as any reader checks it; a batch of
messages encodes byte for byte as each message alone."""

from __future__ import annotations

import struct
from typing import Any

from tarry.model.ids import IdGenerator
from tarry.model.message import Message, Report, Undeliverable
from tarry.store.log.record import (
    HEADER,
    MESSAGE,
    RELEASED,
    Record,
    _flagged_payload,
    _frame,
    decode_message,
    encode_markers,
    encode_message,
    encode_messages,
    scan,
    scan_ids,
)


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
