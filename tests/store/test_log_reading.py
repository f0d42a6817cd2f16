"""Reading due messages back (``tarry.store.log.reading``): a fetch reads a round's records per
partition in one go, and a record that cannot be read is reported and left out, never
delivered, whether the round's messages share one partition or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.store.test_log_recovery import NOW, G, message, opened


def _flip_a_byte_of(root: Path, body: bytes) -> Path:
    """Damage the record holding ``body`` in whichever segment has it; returns the segment."""
    for segment in sorted(root.rglob("*.seg-*.log")):
        data = bytearray(segment.read_bytes())
        at = data.find(body)
        if at >= 0:
            data[at] ^= 0xFF
            segment.write_bytes(bytes(data))
            return segment
    raise AssertionError(f"no segment holds {body!r}")


@pytest.mark.parametrize("spread", [False, True])
async def test_a_damaged_record_is_reported_and_left_out_of_the_round(
    tmp_path: Path, spread: bool
) -> None:
    # Given three messages due together, in one partition or a partition each, indexed and
    # their records on disk, and then the middle one's record damaged
    store = await opened(tmp_path / "log", prefetch_ms=3 * G)
    try:
        step = G if spread else 1  # a partition each, or one for all
        batch = [message(NOW + 5 + k * step, b"body-%d" % k) for k in range(3)]
        await store.store(batch)
        assert await store.fetch_due(NOW, limit=10, lease_ms=60_000) == []  # indexed
        store.files.flush()  # on disk
        segment = _flip_a_byte_of(tmp_path / "log", b"body-1")
        # When the round that finds them due reads them
        due = await store.fetch_due(NOW + 5 + 2 * step, limit=10, lease_ms=60_000)
        # Then the others are delivered and the damaged one is named, not delivered
        assert [m.id for m in due] == [batch[0].id, batch[2].id]
        assert [m.body for m in due] == [b"body-0", b"body-2"]
        [line] = store.state.damaged
        assert str(segment) in line and "checksum mismatch" in line
    finally:
        await store.close()


async def test_a_damaged_last_record_of_a_partition_indexed_while_running_is_reported(
    tmp_path: Path,
) -> None:
    # Given two messages due far ahead in one partition, not yet indexed, their records on
    # disk, and then the last record of the partition damaged (nothing valid follows it)
    store = await opened(tmp_path / "log", prefetch_ms=G)
    try:
        due_at = NOW + 30 * G
        batch = [message(due_at + k, b"far-%d" % k) for k in range(2)]
        await store.store(batch)
        assert await store.fetch_due(NOW, limit=10, lease_ms=60_000) == []
        store.files.flush()
        segment = _flip_a_byte_of(tmp_path / "log", b"far-1")
        # When the partition comes near and its round reads it
        due = await store.fetch_due(due_at + 1, limit=10, lease_ms=60_000)
        # Then the first is delivered and the damaged one is named, not skipped unreported
        assert [m.id for m in due] == [batch[0].id]
        [line] = store.state.damaged
        assert str(segment) in line
    finally:
        await store.close()
