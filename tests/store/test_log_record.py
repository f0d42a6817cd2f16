"""The log store's marker codec: a batch of markers framed at once reads back marker by
marker, each record checked (version, length, CRC) as any reader checks it."""

from __future__ import annotations

import struct

from tarry.model.ids import IdGenerator
from tarry.store.log.record import RELEASED, Record, _frame, encode_markers, scan


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
