"""A stored batch is laid out by partition and split at segment size (store/log/batch.py): every
message joins its partition's index at once, at the position its record was written to, and
reads back from there."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.batch import place
from tarry.store.log.fs import OsFiles
from tarry.store.log.layout import Layout
from tarry.store.log.partition import Partition
from tarry.store.log.record import MESSAGE, Record, encode_messages
from tarry.store.log.segment import SegmentFiles
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


def test_a_batch_over_many_partitions_is_laid_out_in_one_blob_a_run_per_partition() -> None:
    # Given 300 records due over a year (some 25 to each of 12 months), of different sizes,
    # and segments of 2,000 bytes
    layout = Layout(G)
    month = 30 * 86_400_000
    batch = [message(NOW + (i * 7 % 12) * month + i, b"z" * (i % 50)) for i in range(300)]
    records = encode_messages(batch, [0] * len(batch))
    made: dict[int, Partition] = {}

    def partitions_of(keys: list[int]) -> list[Partition]:
        return [made.setdefault(k, Partition(Path("/nowhere"), k, layout)) for k in keys]

    # When they are laid out
    placed = place(
        [m.deliver_at_ms for m in batch],
        records,
        layout=layout,
        now_ms=NOW,
        segment_bytes=2_000,
        partitions_of=partitions_of,
    )
    # Then the blob holds every record once, partition by partition in key order, each
    # partition's records in the order given
    assert placed.order is not None
    order = placed.order.tolist()
    assert sorted(order) == list(range(len(batch)))
    assert placed.data == b"".join(records[i] for i in order)
    keys = [layout.key_for(m.deliver_at_ms, NOW) for m in batch]
    assert order == sorted(range(len(batch)), key=lambda i: keys[i])
    # And each run is one partition's slice, under a segment's size, with the rows it holds
    assert placed.bounds[-1] == len(placed.data) and placed.rows[-1] == len(batch)
    for run, (partition, chunk) in enumerate(placed.slices()):
        rows = order[placed.rows[run] : placed.rows[run + 1]]
        assert {keys[i] for i in rows} == {partition.number}
        assert bytes(chunk) == b"".join(records[i] for i in rows)
        assert len(chunk) <= 2_000
        # and its records sit at the positions the index takes
        for i, pos in zip(rows, placed.positions(run, 10_000).tolist(), strict=True):
            assert bytes(chunk)[pos - 10_000 :].startswith(records[i])
        assert placed.dues[placed.rows[run] : placed.rows[run + 1]].tolist() == [
            batch[i].deliver_at_ms for i in rows
        ]
    assert len(placed.partitions) > len(set(keys))  # some runs were split at segment size


class _FailingOnce(OsFiles):
    """The real files, but the next ``write`` fails part-way (a full disk) once ``fail`` is
    set, after writing some of its bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        if self.fail:
            self.fail = False
            view = memoryview(data)
            os.write(fd, view[:10])
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(fd, data)

    def writev(self, fd: int, chunks: Sequence[bytes | memoryview]) -> None:
        if self.fail:  # partition files are written out with writev
            self.write(fd, b"".join(chunks))
        super().writev(fd, chunks)


def test_bytes_held_for_a_partition_survive_a_failed_write_and_more_appends(tmp_path: Path) -> None:
    # Given bytes held for a partition, and a write of them that fails part-way, its error kept
    # (with its traceback, as a failed future would keep it)
    fs = _FailingOnce()
    files = SegmentFiles(fs)
    partition = Partition(tmp_path, Layout.level0(1), Layout(G))
    files.write(partition, 0, b"a" * 100)
    fs.fail = True
    with pytest.raises(OSError) as failed:
        files.flush()
    # When more is appended, and written out
    files.write(partition, 0, b"b" * 50)
    files.flush()
    # Then the file holds everything once, in order, without the failed write's partial bytes
    assert failed.value.errno == errno.ENOSPC
    assert partition.segment_path(0).read_bytes() == b"a" * 100 + b"b" * 50
    files.close()
