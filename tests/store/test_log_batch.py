"""A stored batch is grouped by partition and split at segment size (store/log/batch.py): every
message joins its partition's index at once, at the position its record was written to, and
reads back from there."""

from __future__ import annotations

from pathlib import Path

from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.layout import Layout
from tarry.store.log.record import MESSAGE, Record, encode_messages
from tests.store.test_log_recovery import NOW, G, message


async def test_a_batch_over_two_partitions_and_several_segments_is_indexed_where_written(
    tmp_path: Path,
) -> None:
    # Given a store with small segments, and a batch that alternates between two near
    # partitions (indexed from birth) with records of different sizes, one larger than a
    # segment
    store = LogStore(tmp_path, granularity_ms=G, segment_bytes=400, prefetch_ms=2 * G)
    await store.open()
    batch = [message(NOW + (i % 2) * G + i, b"x" * (i * 7 % 90)) for i in range(40)]
    batch.append(message(NOW + 1, b"y" * 1000))
    # When it is stored
    outcomes = await store.store(batch)
    # Then every message is new, and each partition's index holds its messages at once, at
    # positions where their own records are
    assert [o.message.id for o in outcomes if o.created] == [m.id for m in batch]
    for number in (NOW // G, NOW // G + 1):
        partition = store.partitions[Layout.level0(number)]
        assert partition.index is not None
        due, pos = partition.index.arrays()
        wanted = sorted((m.deliver_at_ms, m.id) for m in batch if m.deliver_at_ms // G == number)
        read = [store.files.read(partition, int(p)) for p in pos]
        assert all(isinstance(r, Record) and r.kind == MESSAGE for r in read)
        assert [(int(d), r.id) for d, r in zip(due, read, strict=True)] == wanted  # type: ignore[union-attr]
        # and no group of the batch crossed a segment boundary: every segment but the one
        # holding the large record stays within its size
        large = [len(encode_messages(batch[-1:], [0])[0])] if number == NOW // G else []
        assert [s for s in partition.sizes if s > 400] == large
    # And everything is fetched in due order, then released
    fetched = await store.fetch_due(NOW + 2 * G, limit=100, lease_ms=G)
    assert [m.id for m in fetched] == [m.id for m in sorted(batch, key=lambda m: m.deliver_at_ms)]
    await store.remove([m.id for m in fetched], state=MessageState.DELIVERED, now_ms=NOW + 2 * G)
    assert await store.count_scheduled() == 0
    assert await store.check() == []
    await store.close()
