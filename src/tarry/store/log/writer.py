"""``GroupWriter``: group commit for the log store. Callers reserve their positions at once (in
call order, on the event loop) and wait; one writer thread writes each group as ONE record of the
write-ahead log (``wal.py``) with one ``write`` and, when durable, one ``fsync``, however many
partitions the group touches (policies in ``segment.py``); then it appends the same bytes to the
partitions' segment files without an fsync (a checkpoint makes them durable, ``checkpoint.py``).
When a group is written, every caller's ``on_written`` runs on the event loop in the same step
that advances the partitions' ``written`` sizes and the WAL position ``wal_end``, so a
checkpoint captured at any moment sees sizes, WAL position and in-memory state that agree.

A failed group (a full disk, an I/O error) fails every caller waiting (``StorageFault`` for a
disk fault, 503 to a producer: nothing was stored) and is cut back: each partition's reserved
sizes return to what is written, and before the next group writes, the writer thread truncates
(and fsyncs) the WAL and every file the failed group touched to that length, so a later group
never follows a partial record and a failed write never turns up after a restart. The next
append simply tries again; ``probe`` is the store breaker's trial while no producer is let
through.

Markers that need no fsync and that no caller waits for (``defer``: a release into a local queue,
which the queue database holds first) do not make a group of their own: they wait in line, in
position order, and go with the next group that a caller waits for (a producer's send) or, when
none comes within ``linger_ms``, as a group of their own. Each group is then one thread hand-off
fewer on the event loop. A crash may lose the markers still waiting, as it may lose any marker
written without an fsync; the queue database makes their messages' second release a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tarry.errors import TarryError, Unavailable
from tarry.store.faults import storage_fault
from tarry.store.log.partition import Partition, mark_written, reserve, split
from tarry.store.log.segment import FLUSH_BYTES, SegmentFiles
from tarry.store.log.wal import MAGIC, WalLog, WalPosition, encode_group

__all__ = ["LINGER_MS", "Chunk", "GroupWriter", "OnFailed", "OnWritten"]

log = logging.getLogger(__name__)

#: Called on the event loop with the positions of the caller's records once they are written.
OnWritten = Callable[[list[int]], None]
#: Bytes to append: a record, markers, or a stored batch's run (a slice of its blob).
Chunk = bytes | memoryview
_Write = tuple[Partition, int, Chunk]
#: Called on the event loop when a deferred append's group failed (nothing of it was written).
OnFailed = Callable[[], None]
#: (writes, the waiting caller's future or None when deferred, durable, on_written, on_failed)
_Entry = tuple[list[_Write], "asyncio.Future[None] | None", bool, OnWritten | None, OnFailed | None]
#: The probe's write: one page, what any append needs at least.
_PROBE_BYTES = 4096
#: How long deferred markers wait for a group to go with before they make one of their own.
LINGER_MS = 50


def _as_unavailable(exc: BaseException) -> TarryError:
    if isinstance(exc, TarryError):
        return exc
    fault = storage_fault(exc, what="the log store")
    return fault or Unavailable(
        f"the log store cannot write ({exc}); nothing was stored, retry later"
    )


class GroupWriter:
    def __init__(
        self,
        files: SegmentFiles,
        wal: WalLog,
        executor: ThreadPoolExecutor,
        *,
        fsync: str,
        commit_interval_ms: int,
        segment_bytes: int,
        linger_ms: int = LINGER_MS,
    ) -> None:
        self.files = files
        self.wal = wal
        #: The WAL position after the last group whose ``on_written`` has run.
        self.wal_end = WalPosition(0, 0)
        #: Where the WAL is cut back to before the next group (a failed group's bytes).
        self._wal_cut: WalPosition | None = None
        self.executor = executor
        self.fsync = fsync
        self.commit_interval_ms = commit_interval_ms
        self.segment_bytes = segment_bytes
        self.sealed = False
        #: Files a failed group may have left bytes in, and the length to cut each back to
        #: (before the next group writes: ``repair``). Noted on the event loop, cut on the
        #: writer thread (a probe may be cutting while a group fails): under ``_cut_lock``.
        self._cut: dict[Path, int] = {}
        self._cut_lock = threading.Lock()
        self._failing = False
        self.groups = 0
        #: Groups that carried a durable write (a producer waits for them): each costs one fsync
        #: of the WAL under ``batch`` and ``always``; the others (markers) none.
        self.durable_groups = 0
        self._pending: list[_Entry] = []
        #: Entries of ``_pending`` a caller waits for (the others are deferred).
        self._awaited = 0
        self.linger_ms = linger_ms
        self._linger: asyncio.TimerHandle | None = None
        self._flushing = False
        self._last_fsync = 0.0

    @property
    def idle(self) -> bool:
        return not self._pending and not self._flushing

    @property
    def cut_pending(self) -> bool:
        """A failed group's bytes may still be in its files (``repair`` has not succeeded)."""
        return bool(self._cut) or self._wal_cut is not None

    def check(self) -> None:
        if self.sealed:
            raise Unavailable("the log store is closed; retry once tarry has restarted")

    def seal(self) -> None:
        """Refuse every later append (a clean close has recorded the files as final)."""
        self.sealed = True

    async def append(
        self,
        items: Sequence[tuple[Partition, Chunk]],
        *,
        durable: bool,
        on_written: OnWritten | None = None,
    ) -> list[int]:
        """Append ``items``; returns their positions once written (fsynced when ``durable``
        and the policy fsyncs)."""
        self.check()
        writes = reserve(items, self.segment_bytes)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((writes, future, durable, on_written, None))
        self._awaited += 1
        self._start()
        await future
        return [pos for _, pos, _ in writes]

    def defer(
        self,
        items: Sequence[tuple[Partition, Chunk]],
        *,
        on_written: OnWritten,
        on_failed: OnFailed,
    ) -> None:
        """Append ``items`` without an fsync and without waiting: they go with the next group a
        caller waits for, or on their own after ``linger_ms`` (see the module docstring).
        ``on_written`` or ``on_failed`` runs on the event loop once the group is done."""
        self.check()
        writes = reserve(items, self.segment_bytes)
        self._pending.append((writes, None, False, on_written, on_failed))
        if not self._flushing and self._linger is None:
            loop = asyncio.get_running_loop()
            self._linger = loop.call_later(self.linger_ms / 1000, self._start)

    async def drain(self) -> None:
        """Write deferred entries now and wait for them (cleanup and a close do not wait out
        ``linger_ms``). Raises what their group raised."""
        if len(self._pending) > self._awaited:
            await self.append([], durable=False)

    def _start(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        first = True
        try:
            # The first group takes everything (a caller or the linger started this); later
            # ones only when a caller waits: deferred entries alone wait for the linger.
            while self._pending and (first or self._awaited):
                first = False
                if self.fsync == "batch" and any(e[2] for e in self._pending):
                    # Gather durable writes for one fsync; markers alone need no gathering.
                    wait = self.commit_interval_ms / 1000 - (time.monotonic() - self._last_fsync)
                    if wait > 0:
                        await asyncio.sleep(wait)
                batch, self._pending, self._awaited = self._pending, [], 0
                durable = self.fsync != "never" and any(e[2] for e in batch)
                try:
                    end = await loop.run_in_executor(
                        self.executor, self._write_group, batch, durable
                    )
                except BaseException as exc:
                    # Everything reserved is in ``batch`` or ``_pending``: fail it all and give
                    # its reservations back, in this step, before another append reserves.
                    failed, self._pending, self._awaited = batch + self._pending, [], 0
                    self._cut_back(failed)
                    error = _as_unavailable(exc)
                    if not self._failing:  # once per outage, not once per group
                        self._failing = True
                        log.error("log store write failed; retrying with each write: %s", error)
                    for _, future, _, _, on_failed in failed:
                        if future is not None and not future.done():
                            future.set_exception(error)
                        elif on_failed is not None:
                            self._call(on_failed)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                if self._failing:
                    self._failing = False
                    log.warning("log store writes succeed again")
                self._last_fsync = time.monotonic()
                self.groups += 1
                self.durable_groups += durable
                self.wal_end = end
                for writes, future, _, on_written, _ in batch:
                    mark_written(writes)
                    if on_written is not None:
                        try:
                            on_written([pos for _, pos, _ in writes])
                        except Exception as exc:  # a bug: fail the caller, keep the writer
                            log.exception("log store bookkeeping failed")
                            if future is not None and not future.done():
                                future.set_exception(exc)
                    if future is not None and not future.done():
                        future.set_result(None)
                if self.files.pending_bytes > FLUSH_BYTES:
                    # After the group's callers have their answer, not before: the write-out
                    # may create a partition's directory and file, which can take as long as
                    # many groups, and the WAL already holds every byte of it.
                    await loop.run_in_executor(self.executor, self._write_out)
        finally:
            self._flushing = False
            if self._pending and self._linger is None:
                self._linger = loop.call_later(self.linger_ms / 1000, self._start)

    @staticmethod
    def _call(callback: OnFailed) -> None:
        try:
            callback()
        except Exception:  # a bug: keep the writer
            log.exception("log store bookkeeping failed")

    def _cut_back(self, failed: list[_Entry]) -> None:
        """On the event loop, after a failed group: every partition's reservations back to what
        is written, and each touched file noted to be cut back to that length."""
        with self._cut_lock:
            for writes, _, _, _, _ in failed:
                for partition, pos, _ in writes:
                    segment = split(pos)[0]
                    done = partition.written[segment] if segment < len(partition.written) else 0
                    path = partition.segment_path(segment)
                    self._cut[path] = min(self._cut.get(path, done), done)
                    partition.sizes = list(partition.written)

    def repair(self) -> None:
        """On the writer thread: cut back what failed groups may have left (a no-op when
        nothing failed). Raises ``StorageFault`` (or ``Unavailable``) when it cannot."""
        with self._cut_lock:
            cut = dict(self._cut)
            wal_cut, self._wal_cut = self._wal_cut, None
        if wal_cut is not None and wal_cut.seq == self.wal.seq:
            try:
                self.wal.cut(wal_cut.offset)
            except OSError as exc:
                with self._cut_lock:
                    self._wal_cut = self._wal_cut or wal_cut
                raise _as_unavailable(exc) from exc
        if not cut:
            return
        try:
            self.files.cut(cut)
        except OSError as exc:
            raise _as_unavailable(exc) from exc
        log.info("cut %d segment file(s) back after a failed write", len(cut))
        with self._cut_lock:  # keep what a group failing meanwhile noted
            for path, length in cut.items():
                if self._cut.get(path) == length:
                    del self._cut[path]

    def probe(self, root: Path) -> None:
        """On the writer thread, the store breaker's trial: ``repair``, then write and fsync a
        page-sized scratch file under ``root`` (a full disk refuses it), and delete it."""
        self.repair()
        path = root / ".probe"
        fs = self.files.fs
        try:
            try:
                fs.write_file(path, bytes(_PROBE_BYTES), what="probe")
            finally:
                fs.unlink(path)
        except OSError as exc:
            raise _as_unavailable(exc) from exc

    def _write_group(self, batch: list[Any], durable: bool) -> WalPosition:
        """On the writer thread: the group's WAL record (one write, one fsync when durable),
        then its bytes handed to the partitions' files, held in memory and written out once the
        group's callers are answered (``_write_out``; fsynced by a checkpoint). Returns the WAL
        position after the group."""
        self.repair()
        writes = [write for entry in batch for write in entry[0]]
        start = self.wal.position
        try:
            self.wal.append(encode_group(writes))
            if durable:
                self.wal.sync()
        except BaseException:
            with self._cut_lock:  # a roll to a new segment: cut that back to its magic
                rolled = start.seq != self.wal.seq
                self._wal_cut = WalPosition(self.wal.seq, len(MAGIC)) if rolled else start
            raise
        self.files.hold(writes)  # held in memory, written behind the WAL (``_write_out``)
        return self.wal.position

    def _write_out(self) -> None:
        """On the writer thread, between groups: what the partitions hold in memory written to
        their files (``SegmentFiles.flush``), once past ``FLUSH_BYTES``."""
        try:
            self.files.flush()
        except OSError as exc:  # the WAL has it: the next flush or checkpoint tries again
            log.warning("writing partitions behind the write-ahead log failed: %s", exc)

    def sync_dirty(self, root: Path | None = None) -> None:
        """fsync every segment written since its last fsync (before a snapshot: markers, and
        under ``never`` everything, are written without one); many at once: one sync of
        ``root``'s file system (``SegmentFiles.sync_dirty``)."""
        self.files.sync_dirty(root)
