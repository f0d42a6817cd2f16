"""``record_walk.index_walk``: the index entries of a stretch of records read in place, the same
as ``scan`` reading each record whole gives, stopping at bytes that are not a record."""

from __future__ import annotations

import random
from collections import Counter

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
from tarry.store.log.record_walk import IndexEntries, ReplayEntries, index_walk, replay_walk
from tests.store.test_log_recovery import NOW, message


def _stretch(seed: int) -> bytes:
    """Messages of varied bodies and due times, and markers of every kind, mixed."""
    rng = random.Random(seed)
    parts: list[bytes] = []
    for k in range(300):
        kind = rng.choice([MESSAGE, MESSAGE, MESSAGE, RELEASED, CANCELLED, MOVED, FAILED])
        if kind == MESSAGE:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
            sent = message(NOW + rng.randrange(10**9), body, rng.choice(["q", "other", "ü"]))
            key = rng.choice([0, 0, rng.randrange(1, 2**62)])  # a de-duplication hash or none
            parts.append(encode_message(sent, key))
        else:
            target, value = rng.randrange(2**50), rng.randrange(2**40)
            destination = rng.choice(["q", "other", "ü"])
            parts.append(
                encode_marker(
                    kind, message(NOW).id, target, value, destination=destination, failures=k
                )
            )
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


def test_the_replay_walk_finds_what_a_scan_of_whole_records_finds() -> None:
    for seed in range(5):
        buf = _stretch(seed)
        found, offset = ReplayEntries(), 0
        while offset < len(buf):
            offset = replay_walk(buf, offset, found)
        assert offset == len(buf)
        counts: Counter[str] = Counter()
        keys, changes, gone = [], [], []
        for item in scan(buf):
            assert isinstance(item, Record)
            if item.kind == MESSAGE:
                due, destination, key = item.meta()
                counts[destination] += 1
                if key:
                    keys.append((key, item.id))
            else:
                target, value = item.marker()
                changes.append((item.kind, item.id, value, item.offset))
                if item.kind != FAILED:
                    counts[item.destination()] -= 1
                    gone.append(target)
        assert (found.due, found.offsets) == _by_scan(buf)[:2]
        assert {d.decode(): n for d, n in found.counts.items()} == dict(counts)
        assert [(k, i.decode()) for k, i in found.keyed] == keys
        assert [(k, i.decode(), v, o) for k, i, v, o in found.changes] == changes
        assert found.gone == gone and found.finished == len(gone)
        assert found.records == len(list(scan(buf)))
