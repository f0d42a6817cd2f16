"""``GroupWriter``: group commit for the log store. Callers reserve their positions at once (in
call order, on the event loop) and wait; one writer thread writes each group with one
``write`` per touched segment and one ``fsync`` per touched segment (policies in
``segment.py``). When a group is on disk, every caller's ``on_written`` runs on the event loop
in the same step that advances the partitions' ``written`` sizes, so a snapshot taken at any
moment sees sizes and in-memory state that agree.

A failed write breaks the writer for good (reserved positions no longer match the files):
every later call raises ``Unavailable`` until tarry restarts and recovers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tarry.errors import Unavailable
from tarry.store.log.partition import Partition, split
from tarry.store.log.segment import SegmentFiles

__all__ = ["GroupWriter", "OnWritten"]

log = logging.getLogger(__name__)

#: Called on the event loop with the positions of the caller's records once they are written.
OnWritten = Callable[[list[int]], None]
_Write = tuple[Partition, int, bytes]
_Entry = tuple[list[_Write], "asyncio.Future[None]", bool, OnWritten | None]


class GroupWriter:
    def __init__(
        self,
        files: SegmentFiles,
        executor: ThreadPoolExecutor,
        *,
        fsync: str,
        commit_interval_ms: int,
        segment_bytes: int,
    ) -> None:
        self.files = files
        self.executor = executor
        self.fsync = fsync
        self.commit_interval_ms = commit_interval_ms
        self.segment_bytes = segment_bytes
        self.broken: BaseException | None = None
        self.sealed = False
        self.groups = 0
        self._pending: list[_Entry] = []
        self._flushing = False
        self._last_fsync = 0.0

    @property
    def idle(self) -> bool:
        return not self._pending and not self._flushing

    def check(self) -> None:
        if self.broken is not None:
            raise Unavailable(
                f"the log store failed to write ({self.broken}); restart tarry to recover"
            )
        if self.sealed:
            raise Unavailable("the log store is closed; retry once tarry has restarted")

    def seal(self) -> None:
        """Refuse every later append (a clean close has recorded the files as final)."""
        self.sealed = True

    async def append(
        self,
        items: list[tuple[Partition, bytes]],
        *,
        durable: bool,
        on_written: OnWritten | None = None,
    ) -> list[int]:
        """Append ``items``; returns their positions once written (fsynced when ``durable``
        and the policy fsyncs)."""
        self.check()
        writes = [(p, p.reserve(len(data), self.segment_bytes), data) for p, data in items]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((writes, future, durable, on_written))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush())
        await future
        return [pos for _, pos, _ in writes]

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                if self.fsync == "batch" and any(e[2] for e in self._pending):
                    # Gather durable writes for one fsync; markers alone need no gathering.
                    wait = self.commit_interval_ms / 1000 - (time.monotonic() - self._last_fsync)
                    if wait > 0:
                        await asyncio.sleep(wait)
                batch, self._pending = self._pending, []
                durable = self.fsync != "never" and any(e[2] for e in batch)
                try:
                    await loop.run_in_executor(self.executor, self._write_group, batch, durable)
                except BaseException as exc:
                    log.exception("log store write failed; the store stops taking writes")
                    self.broken = exc
                    error = Unavailable(f"the log store cannot write ({exc}); retry later")
                    for entry in batch + self._pending:
                        if not entry[1].done():
                            entry[1].set_exception(error)
                    self._pending = []
                    return
                self._last_fsync = time.monotonic()
                self.groups += 1
                for writes, future, _, on_written in batch:
                    for partition, pos, data in writes:
                        segment, offset = split(pos)
                        while len(partition.written) <= segment:
                            partition.written.append(0)
                        partition.written[segment] = max(
                            partition.written[segment], offset + len(data)
                        )
                    if on_written is not None:
                        try:
                            on_written([pos for _, pos, _ in writes])
                        except Exception as exc:  # a bug: fail the caller, keep the writer
                            log.exception("log store bookkeeping failed")
                            if not future.done():
                                future.set_exception(exc)
                    if not future.done():
                        future.set_result(None)
        finally:
            self._flushing = False

    def _write_group(self, batch: list[Any], durable: bool) -> None:
        grouped: dict[tuple[int, int], list[bytes]] = {}
        owners: dict[tuple[int, int], Partition] = {}
        for writes, _, _, _ in batch:
            for partition, pos, data in writes:
                key = (partition.number, split(pos)[0])
                grouped.setdefault(key, []).append(data)
                owners[key] = partition
        self.files.trim()
        fds = {self.files.write(owners[key], key[1], b"".join(c)) for key, c in grouped.items()}
        if durable:
            self.files.sync(fds)

    def sync_all(self) -> None:
        """fsync every segment open for writing (before a snapshot under ``never``)."""
        self.files.sync_all()
