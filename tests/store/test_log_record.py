"""The log store's marker codec: a batch of markers framed at once reads back marker by
marker, each record checked (version, length, CRC) as any reader checks it."""

from __future__ import annotations

import struct

from tarry.model.ids import IdGenerator
from tarry.store.log.record import (
    HEADER,
    RELEASED,
    Record,
    _frame,
    encode_markers,
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
