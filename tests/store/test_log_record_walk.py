"""``record_walk.index_walk``: the index entries of a stretch of records read in place, the same
as ``scan`` reading each record whole gives, stopping at bytes that are not a record."""

from __future__ import annotations

import random

from tarry.store.log.record import (
    CANCELLED,
    FAILED,
    MESSAGE,
    MOVED,
    RELEASED,
    Record,
    encode_marker,
    encode_message,
    scan,
)
from tarry.store.log.record_walk import IndexEntries, index_walk
from tests.store.test_log_recovery import NOW, message


def _stretch(seed: int) -> bytes:
    """Messages of varied bodies and due times, and markers of every kind, mixed."""
    rng = random.Random(seed)
    parts: list[bytes] = []
    for k in range(300):
        kind = rng.choice([MESSAGE, MESSAGE, MESSAGE, RELEASED, CANCELLED, MOVED, FAILED])
        if kind == MESSAGE:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
            parts.append(encode_message(message(NOW + rng.randrange(10**9), body)))
        else:
            target, value = rng.randrange(2**50), rng.randrange(2**40)
            parts.append(encode_marker(kind, message(NOW).id, target, value, failures=k))
    return b"".join(parts)


def _by_scan(buf: bytes) -> tuple[list[int], list[int], list[int], int]:
    due, offsets, gone, records = [], [], [], 0
    for item in scan(buf):
        if not isinstance(item, Record):
            break
        records += 1
        if item.kind == MESSAGE:
            due.append(item.due_ms())
            offsets.append(item.offset)
        elif item.kind != FAILED:
            gone.append(item.marker()[0])
    return due, offsets, gone, records


def test_the_walk_finds_what_a_scan_finds_in_any_number_of_calls() -> None:
    for seed in range(5):
        buf = _stretch(seed)
        found, offset, calls = IndexEntries(), 0, 0
        while offset < len(buf):
            offset = index_walk(buf, offset, 7 + seed, found)
            calls += 1
        assert offset == len(buf) and calls > 10
        assert (found.due, found.offsets, found.gone, found.records) == _by_scan(buf)


def test_the_walk_stops_at_damage_and_at_a_cut_record() -> None:
    buf = _stretch(7)
    due, offsets, _, _ = _by_scan(buf)
    # A flipped byte inside the tenth message: the walk stops at its first byte
    damaged = bytearray(buf)
    damaged[offsets[9] + 40] ^= 0xFF
    found = IndexEntries()
    assert index_walk(bytes(damaged), 0, 10**6, found) == offsets[9]
    assert found.due == due[:9]
    # The stretch cut through the tenth message: the walk stops at its start
    found = IndexEntries()
    assert index_walk(buf[: offsets[9] + 30], 0, 10**6, found) == offsets[9]
    assert found.due == due[:9]
