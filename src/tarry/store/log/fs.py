"""``Files``: every change the log store makes to its files goes through this one small
interface (creating, appending, truncating, fsyncing, renaming, linking, deleting, and fsyncing
directories), so a test double can record them and show what a power loss would leave
(``tests/store/crashfs.py``). ``OsFiles`` is the real one; it counts its fsyncs by what they
make durable (``/metrics``).

Reads (``mmap``, ``pread``, directory listings) go to the operating system directly: the double
works on a real directory, so what the store reads back is what it wrote.

Calls are per file and per group, never per record: a group commit makes one ``write`` (of the
write-ahead log), and writing partitions out behind it one ``writev`` per touched segment.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

__all__ = ["HAS_SYNCFS", "SYNCFS_REPORTS_ERRORS", "Files", "FsyncWhat", "OsFiles"]

#: What an fsync makes durable (the label of ``tarry_store_fsyncs_total``): ``wal`` the group
#: commit's (``wal.py``), ``partition`` a checkpoint's of partition segments, ``checkpoint`` its
#: snapshot parts and commit record.
FsyncWhat = Literal[
    "wal", "wal_segment", "partition", "directory", "checkpoint", "filesystem", "probe"
]


class Files(Protocol):
    """The log store's file changes. Each raises ``OSError`` as the system call does."""

    #: fsyncs made so far, by what they made durable (``FsyncWhat``; ``directory`` for
    #: ``fsync_dir``, ``filesystem`` for ``sync_filesystem``).
    fsyncs: dict[str, int]

    def open_append(self, path: Path) -> int:
        """A descriptor appending to ``path``, created when missing."""

    def open_existing(self, path: Path) -> int:
        """A descriptor writing to an existing ``path``; ``FileNotFoundError`` when missing."""

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` at the descriptor's position (the end, for appends)."""

    def writev(self, fd: int, chunks: Sequence[bytes | memoryview]) -> None:
        """Write all of ``chunks``, in order, at the descriptor's position, not joined first."""

    def truncate(self, fd: int, length: int) -> None:
        """Cut the file to ``length`` bytes when it is longer."""

    def fsync(self, fd: int, *, what: FsyncWhat) -> None:
        """Make the file's bytes durable."""

    def close(self, fd: int) -> None: ...

    def write_file(self, path: Path, data: bytes, *, what: FsyncWhat) -> None:
        """Create (or replace the contents of) ``path`` with ``data``, fsynced."""

    def truncate_path(self, path: Path, length: int) -> None:
        """Cut the file at ``path`` to ``length`` bytes (not fsynced)."""

    def fsync_dir(self, path: Path) -> None:
        """Make the entries of directory ``path`` durable (creates, renames, deletes)."""

    def sync_filesystem(self, path: Path) -> None:
        """Make every write to the file system holding ``path`` durable; ``OSError`` when a
        write-back failed (where the system reports it: ``SYNCFS_REPORTS_ERRORS``)."""

    def mkdir(self, path: Path) -> None:
        """Create directory ``path`` and its missing parents (not fsynced)."""

    def rename(self, src: Path, dst: Path) -> None:
        """Replace ``dst`` with ``src`` (atomic; durable once both directories are fsynced)."""

    def link(self, src: Path, dst: Path) -> None:
        """Give the file ``src`` a second name ``dst`` (no new inode; durable once ``dst``'s
        directory is fsynced); ``FileExistsError`` when ``dst`` exists."""

    def unlink(self, path: Path) -> None:
        """Delete the file at ``path``, if any."""

    def remove_tree(self, path: Path) -> None:
        """Delete directory ``path`` with everything in it, if it exists."""


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _kernel_at_least(major: int, minor: int) -> bool:
    numbers = platform.release().split("-")[0].split(".")
    try:
        return (int(numbers[0]), int(numbers[1])) >= (major, minor)
    except (IndexError, ValueError):
        return False


#: Buffers one ``writev`` takes at most.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16


_syncfs = _load_syncfs()
#: ``sync_filesystem`` is one ``syncfs`` (Linux), not a ``sync`` of every file system.
HAS_SYNCFS = _syncfs is not None
#: ``syncfs`` reports a failed write-back of any file of the file system (Linux 5.8 and later;
#: before, it returned success regardless), so it may stand in for fsyncs whose errors matter.
SYNCFS_REPORTS_ERRORS = HAS_SYNCFS and platform.system() == "Linux" and _kernel_at_least(5, 8)


class OsFiles:
    """The real file system. ``fsyncs`` counts fsyncs by what they made durable (plain ints,
    read at scrape time)."""

    def __init__(self) -> None:
        self.fsyncs: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.fsyncs[what] = self.fsyncs.get(what, 0) + 1

    def open_append(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def open_existing(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY)

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def writev(self, fd: int, chunks: Sequence[bytes | memoryview]) -> None:
        left = list(chunks) if all(chunks) else [chunk for chunk in chunks if chunk]
        first = 0
        while first < len(left):
            batch = left[first : first + _IOV_MAX]
            done = os.writev(fd, batch)
            if done == sum(map(len, batch)):
                first += len(batch)
                continue
            while done:  # a short write: past what it wrote, within the batch
                size = len(left[first])
                if done < size:
                    left[first] = memoryview(left[first])[done:]
                    break
                done -= size
                first += 1

    def truncate(self, fd: int, length: int) -> None:
        if os.fstat(fd).st_size > length:
            os.ftruncate(fd, length)

    def fsync(self, fd: int, *, what: FsyncWhat) -> None:
        os.fsync(fd)
        self._count(what)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write_file(self, path: Path, data: bytes, *, what: FsyncWhat) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.write(fd, data)
            self.fsync(fd, what=what)
        finally:
            os.close(fd)

    def truncate_path(self, path: Path, length: int) -> None:
        os.truncate(path, length)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._count("directory")

    def sync_filesystem(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if _syncfs is None:
                os.sync()
            elif _syncfs(fd) != 0:
                code = ctypes.get_errno()
                if code != errno.ENOSYS:  # a failed write-back: what was synced is unknown
                    raise OSError(code, os.strerror(code), str(path))
                os.sync()
        finally:
            os.close(fd)
        self._count("filesystem")

    def mkdir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        os.link(src, dst)

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def remove_tree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
