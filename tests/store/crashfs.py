"""``CrashFiles``: a ``Files`` (``tarry.store.log.fs``) that works on a real directory and records
every change it makes (creates, writes, truncates, fsyncs, renames, links, deletes, fsyncs of
directories), and ``disk_after``: the directory a power loss after any of those changes could
leave. As bbolt's power-failure and SQLite's crash tests do:

- everything fsynced survives: a file's bytes once the file is fsynced, a directory's entries
  (files created, renamed in or out, deleted) once the directory is fsynced, and everything at
  once after a ``sync_filesystem``;
- of what was not fsynced, mode ``drop`` keeps nothing, and mode ``prefix`` keeps a random
  prefix of each file's unsynced changes and of each directory's unsynced entry changes (the
  seed picks them).

A file whose directory entry is not durable is lost with it, whatever its own fsyncs; a
directory whose entry is lost takes everything under it.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tarry.store.log.fs import FsyncWhat, OsFiles

Mode = Literal["drop", "prefix"]


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded change. ``kind``: create, mkdir, write, truncate, fsync, fsync_dir,
    syncfs, rename, link, unlink, rmdir, or mark (the test's own note, not a change)."""

    kind: str
    path: Path | None = None
    other: Path | None = None  # rename: the destination
    offset: int = 0  # write: where; truncate: the new length
    data: bytes = b""
    note: object = None  # mark


class CrashFiles(OsFiles):
    """The real file system under ``base`` (which exists before and holds nothing), every change
    recorded in ``ops`` in the order it happened (the writer thread and the event loop may both
    change files: under a lock)."""

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base
        self.ops: list[Op] = []
        self._paths: dict[int, Path] = {}
        self._lock = threading.RLock()

    # --- what the test reads --------------------------------------------------------------------
    def mark(self, note: object) -> None:
        """Note something the test saw happen (an acknowledgement) at this point of the trace."""
        with self._lock:
            self.ops.append(Op("mark", note=note))

    def crash_points(self) -> list[int]:
        """Every boundary between changes: ``disk_after(k)`` for each (0: before the first)."""
        return [0] + [i + 1 for i, op in enumerate(self.ops) if op.kind != "mark"]

    def marks_before(self, point: int) -> list[object]:
        return [op.note for op in self.ops[:point] if op.kind == "mark"]

    # --- the changes ----------------------------------------------------------------------------
    def _record(self, op: Op) -> None:
        self.ops.append(op)

    def open_append(self, path: Path) -> int:
        with self._lock:
            if not path.exists():
                self._record(Op("create", path))
            fd = super().open_append(path)
            self._paths[fd] = path
            return fd

    def open_existing(self, path: Path) -> int:
        with self._lock:
            fd = super().open_existing(path)
            self._paths[fd] = path
            return fd

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        with self._lock:
            path = self._paths[fd]
            offset = os.fstat(fd).st_size  # appends only: at the end
            super().write(fd, data)
            self._record(Op("write", path, offset=offset, data=bytes(data)))

    def writev(self, fd: int, chunks: Sequence[bytes | memoryview]) -> None:
        self.write(fd, b"".join(chunks))  # one change, as the system call makes it

    def truncate(self, fd: int, length: int) -> None:
        with self._lock:
            if os.fstat(fd).st_size > length:
                super().truncate(fd, length)
                self._record(Op("truncate", self._paths[fd], offset=length))

    def fsync(self, fd: int, *, what: FsyncWhat) -> None:
        with self._lock:
            super().fsync(fd, what=what)
            self._record(Op("fsync", self._paths[fd]))

    def close(self, fd: int) -> None:
        with self._lock:
            super().close(fd)
            self._paths.pop(fd, None)

    def write_file(self, path: Path, data: bytes, *, what: FsyncWhat) -> None:
        with self._lock:
            if path.exists():
                self._record(Op("truncate", path, offset=0))
            else:
                self._record(Op("create", path))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:  # the real calls, unrecorded: the three changes are recorded as one here
                OsFiles.write(self, fd, data)
                OsFiles.fsync(self, fd, what=what)
            finally:
                os.close(fd)
            self._record(Op("write", path, offset=0, data=bytes(data)))
            self._record(Op("fsync", path))

    def truncate_path(self, path: Path, length: int) -> None:
        with self._lock:
            super().truncate_path(path, length)
            self._record(Op("truncate", path, offset=length))

    def fsync_dir(self, path: Path) -> None:
        with self._lock:
            super().fsync_dir(path)
            self._record(Op("fsync_dir", path))

    def sync_filesystem(self, path: Path) -> None:
        with self._lock:
            super().sync_filesystem(path)
            self._record(Op("syncfs", path))

    def mkdir(self, path: Path) -> None:
        with self._lock:
            missing = []
            at = path
            while not at.exists():
                missing.append(at)
                at = at.parent
            super().mkdir(path)
            for directory in reversed(missing):
                self._record(Op("mkdir", directory))

    def rename(self, src: Path, dst: Path) -> None:
        with self._lock:
            super().rename(src, dst)
            self._record(Op("rename", src, other=dst))

    def link(self, src: Path, dst: Path) -> None:
        with self._lock:
            super().link(src, dst)
            self._record(Op("link", src, other=dst))

    def unlink(self, path: Path) -> None:
        with self._lock:
            existed = path.exists()
            super().unlink(path)
            if existed:
                self._record(Op("unlink", path))

    def remove_tree(self, path: Path) -> None:
        with self._lock:
            if not path.exists():
                return
            gone: list[Op] = []
            for top, dirs, files in os.walk(path, topdown=False):
                gone += [Op("unlink", Path(top) / name) for name in sorted(files)]
                gone += [Op("rmdir", Path(top) / name) for name in sorted(dirs)]
            gone.append(Op("rmdir", path))
            super().remove_tree(path)
            self.ops.extend(gone)

    # --- what a power loss leaves ---------------------------------------------------------------
    def disk_after(self, point: int, target: Path, *, mode: Mode, seed: int = 0) -> None:
        """Write into the empty directory ``target`` what ``base`` could hold after a power loss
        once the first ``point`` recorded changes were made."""
        _Disk(self.base).replay(self.ops[:point]).crash(target, mode, random.Random(seed))


_DIR = -1  # a directory entry's value for a directory (files get their inode number)


class _Disk:
    """The file system model: inodes with durable and unsynced bytes, and directory entries
    with durable and unsynced changes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.entries: dict[Path, int] = {base: _DIR}  # what the running system sees
        self.durable: dict[Path, int] = {base: _DIR}  # what survives as it stands
        #: Per directory: its entry changes since its last fsync, (path, inode | None) in order.
        self.pending_dirs: dict[Path, list[tuple[Path, int | None]]] = {}
        self.data: dict[int, bytearray] = {}
        self.synced: dict[int, bytes] = {}
        #: Per inode: changes since its last fsync, ("write", offset, data) / ("truncate", n).
        self.pending_data: dict[int, list[tuple[str, int, bytes]]] = {}
        self._inodes = 0

    def _entry(self, path: Path, value: int | None) -> None:
        if value is None:
            self.entries.pop(path, None)
        else:
            self.entries[path] = value
        self.pending_dirs.setdefault(path.parent, []).append((path, value))

    def _new_inode(self) -> int:
        self._inodes += 1
        self.data[self._inodes] = bytearray()
        self.synced[self._inodes] = b""
        self.pending_data[self._inodes] = []
        return self._inodes

    def replay(self, ops: list[Op]) -> _Disk:
        for op in ops:
            path = op.path
            if op.kind == "mark":
                continue
            assert path is not None
            if op.kind == "create":
                self._entry(path, self._new_inode())
            elif op.kind == "mkdir":
                self._entry(path, _DIR)
            elif op.kind in ("unlink", "rmdir"):
                self._entry(path, None)
            elif op.kind == "rename":
                assert op.other is not None
                inode = self.entries[path]
                self._entry(path, None)
                self._entry(op.other, inode)
            elif op.kind == "link":
                assert op.other is not None
                self._entry(op.other, self.entries[path])
            elif op.kind == "write":
                inode = self.entries[path]
                data = self.data[inode]
                data[op.offset : op.offset + len(op.data)] = op.data
                self.pending_data[inode].append(("write", op.offset, op.data))
            elif op.kind == "truncate":
                inode = self.entries[path]
                del self.data[inode][op.offset :]
                self.pending_data[inode].append(("truncate", op.offset, b""))
            elif op.kind == "fsync":
                inode = self.entries[path]
                self.synced[inode] = bytes(self.data[inode])
                self.pending_data[inode] = []
            elif op.kind == "fsync_dir":
                for entry, value in self.pending_dirs.pop(path, []):
                    self._apply(self.durable, entry, value)
            elif op.kind == "syncfs":
                for changes in self.pending_dirs.values():
                    for entry, value in changes:
                        self._apply(self.durable, entry, value)
                self.pending_dirs.clear()
                for inode, data in self.data.items():
                    self.synced[inode] = bytes(data)
                    self.pending_data[inode] = []
            else:
                raise AssertionError(f"unknown change {op.kind}")
        return self

    @staticmethod
    def _apply(entries: dict[Path, int], path: Path, value: int | None) -> None:
        if value is None:
            entries.pop(path, None)
        else:
            entries[path] = value

    def crash(self, target: Path, mode: Mode, rng: random.Random) -> None:
        entries = dict(self.durable)
        if mode == "prefix":
            for _, changes in sorted(self.pending_dirs.items()):
                for path, value in changes[: rng.randint(0, len(changes))]:
                    self._apply(entries, path, value)
        for path, inode in sorted(entries.items(), key=lambda e: len(e[0].parts)):
            if path == self.base or not self._reachable(entries, path):
                continue
            out = target / path.relative_to(self.base)
            if inode == _DIR:
                out.mkdir()
                continue
            data = bytearray(self.synced[inode])
            if mode == "prefix":
                unsynced = self.pending_data[inode]
                for kind, offset, chunk in unsynced[: rng.randint(0, len(unsynced))]:
                    if kind == "write":
                        data[offset : offset + len(chunk)] = chunk
                    else:
                        del data[offset:]
            out.write_bytes(bytes(data))

    def _reachable(self, entries: dict[Path, int], path: Path) -> bool:
        parent = path.parent
        while parent != self.base:
            if entries.get(parent) != _DIR:
                return False
            parent = parent.parent
        return True
