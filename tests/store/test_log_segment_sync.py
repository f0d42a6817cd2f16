"""How a checkpoint makes the partitions' files durable (``SegmentFiles.sync_dirty``): one by
one when they are few, one sync of the file system when they are many (a burst over a year);
a failed sync keeps its files for the next checkpoint, and what a read writes meanwhile is left
for the next one, not forgotten."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from pathlib import Path

import pytest

import tarry.store.log.fs as fs_module
from tarry.store.log.fs import SYNCFS_REPORTS_ERRORS, FsyncWhat, OsFiles
from tarry.store.log.layout import Layout
from tarry.store.log.partition import Partition, parts_root
from tarry.store.log.segment import SegmentFiles

G = 60_000
layout = Layout(G)


def partitions(root: Path, count: int) -> list[Partition]:
    """``count`` partitions of a store at ``root`` (whose ``parts/`` is made at its start)."""
    parts_root(root).mkdir(exist_ok=True)
    return [Partition(root, Layout.level0(n), layout) for n in range(count)]


def written(files: SegmentFiles, made: list[Partition]) -> None:
    for partition in made:
        files.write(partition, 0, b"record")
    files.flush()


@pytest.mark.parametrize(
    ("count", "made"),
    [
        # Few: each file, and the one directory that gained their entries (``parts/``)
        (3, {"partition": 3, "directory": 1}),
        # Many: one sync of the file system stands for 40 file and a directory fsync
        (40, {"filesystem": 1}),
    ],
)
def test_a_checkpoint_fsyncs_few_files_one_by_one_and_many_with_one_sync(
    tmp_path: Path, count: int, made: dict[str, int]
) -> None:
    # Given new partitions written behind the WAL
    files = SegmentFiles(OsFiles())
    files.syncfs_at = 32
    written(files, partitions(tmp_path, count))
    # When a checkpoint syncs them
    files.sync_dirty(tmp_path)
    # Then
    assert files.fs.fsyncs == made
    # And nothing is left for the next checkpoint
    files.sync_dirty(tmp_path)
    assert files.fs.fsyncs == made
    files.close()


def test_a_sync_of_the_file_system_is_used_only_where_it_reports_failed_writes() -> None:
    files = SegmentFiles(OsFiles())
    assert (files.syncfs_at is not None) == SYNCFS_REPORTS_ERRORS


def test_a_failed_sync_of_the_file_system_raises_instead_of_passing_for_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a syncfs whose write-back failed
    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(fs_module, "_syncfs", failing)
    # When the file system is synced, then the failure is raised (not an unchecked sync())
    with pytest.raises(OSError) as raised:
        OsFiles().sync_filesystem(tmp_path)
    assert raised.value.errno == errno.EIO


class FailingFsync(OsFiles):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def fsync(self, fd: int, *, what: FsyncWhat) -> None:
        if self.fail:
            raise OSError(errno.EIO, "injected")
        super().fsync(fd, what=what)


def test_files_a_failed_sync_left_are_synced_by_the_next(tmp_path: Path) -> None:
    # Given two partitions written and a first checkpoint whose fsync fails
    fs = FailingFsync()
    files = SegmentFiles(fs)
    files.syncfs_at = None
    written(files, partitions(tmp_path, 2))
    with pytest.raises(OSError):
        files.sync_dirty(tmp_path)
    # When the next checkpoint syncs
    fs.fail = False
    files.sync_dirty(tmp_path)
    # Then it fsyncs both files and the directory the failed one did not get to
    assert fs.fsyncs == {"partition": 2, "directory": 1}
    files.close()


class FlushDuringFsync(OsFiles):
    """Writes a new partition (as a read on another thread would) during the first fsync."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.files: SegmentFiles | None = None
        self.late = Partition(root, Layout.level0(99), layout)

    def fsync(self, fd: int, *, what: FsyncWhat) -> None:
        if self.files is not None:
            files, self.files = self.files, None
            files.write(self.late, 0, b"late")
            files.flush(self.late)
        super().fsync(fd, what=what)


def test_what_a_read_writes_during_a_sync_is_left_for_the_next(tmp_path: Path) -> None:
    # Given one partition written, and another written while the checkpoint fsyncs
    fs = FlushDuringFsync(tmp_path)
    files = SegmentFiles(fs)
    files.syncfs_at = None
    written(files, partitions(tmp_path, 1))
    fs.files = files
    files.sync_dirty(tmp_path)
    assert fs.fsyncs == {"partition": 1, "directory": 1}
    # When the next checkpoint syncs, then the late file and its directory are fsynced
    files.sync_dirty(tmp_path)
    assert fs.fsyncs == {"partition": 2, "directory": 2}
    files.close()


class SlowFsync(OsFiles):
    """An fsync that waits until told to go on (a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.go_on = threading.Event()

    def fsync(self, fd: int, *, what: FsyncWhat) -> None:
        self.inside.set()
        self.go_on.wait(10)
        super().fsync(fd, what=what)


def test_a_flush_does_not_wait_for_a_checkpoint_fsync(tmp_path: Path) -> None:
    # Given a checkpoint stuck in a partition's fsync on another thread
    fs = SlowFsync()
    files = SegmentFiles(fs)
    files.syncfs_at = None
    [partition] = partitions(tmp_path, 1)
    written(files, [partition])
    checkpoint = threading.Thread(target=files.sync_dirty, args=(tmp_path,))
    checkpoint.start()
    assert fs.inside.wait(10)

    # When a release round flushes that partition's new bytes meanwhile (the event loop)
    def release_round() -> None:
        files.write(partition, 0, b"more")
        files.flush(partition)

    flushing = threading.Thread(target=release_round)
    flushing.start()
    flushing.join(2)
    waited = flushing.is_alive()
    fs.go_on.set()
    flushing.join()
    checkpoint.join()
    # Then it wrote them without waiting for the fsync
    assert not waited
    assert partition.segment_path(0).read_bytes() == b"recordmore"
    files.close()


def test_a_partition_directory_deleted_behind_the_store_is_made_again(tmp_path: Path) -> None:
    # Given a partition written once, then the directory of segment files deleted
    files = SegmentFiles(OsFiles())
    [partition] = partitions(tmp_path, 1)
    written(files, [partition])
    files.close_partition(partition)
    files.fs.remove_tree(partition.segment_path(0).parent)
    # When it is written again, then the directory is made again and holds the bytes
    written(files, [partition])
    assert partition.segment_path(0).read_bytes() == b"record"
    files.close()


def test_a_partition_file_gets_its_appends_in_order_through_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a system whose writev writes at most 7 bytes, and more appends than one writev takes
    real = os.writev

    def short(fd: int, buffers: list[memoryview]) -> int:
        return real(fd, [b"".join(buffers)[:7]])

    monkeypatch.setattr(os, "writev", short)
    monkeypatch.setattr(fs_module, "_IOV_MAX", 3)
    files = SegmentFiles(OsFiles())
    [partition] = partitions(tmp_path, 1)
    appends = [f"record {n};".encode() for n in range(10)] + [b""]
    # When they are held (slices of one batch's bytes, and bytes) and written out
    batch = memoryview(b"".join(appends[:5]))
    at = 0
    for chunk in appends[:5]:
        files.write(partition, 0, batch[at : at + len(chunk)])  # type: ignore[arg-type]
        at += len(chunk)
    for chunk in appends[5:]:
        files.write(partition, 0, chunk)
    files.flush()
    # Then the file holds every append, in order
    assert partition.segment_path(0).read_bytes() == b"".join(appends)
    files.close()


def test_an_append_of_a_buffer_that_may_change_is_held_as_it_was(tmp_path: Path) -> None:
    # Given an append that is a view of a mutable buffer, changed after it was held
    files = SegmentFiles(OsFiles())
    [partition] = partitions(tmp_path, 1)
    buffer = bytearray(b"as appended")
    files.hold([(partition, 0, memoryview(buffer))])
    buffer[:2] = b"XX"
    # When it is written out, then the file holds what was appended
    files.flush()
    assert partition.segment_path(0).read_bytes() == b"as appended"
    files.close()
