"""The journal: every state change appended as one JSON line, for analysis with Spark
(``spark.read.json``) or anything else that reads JSON lines.

Files live in ``<data_dir>/journal/``. The file being written is
``journal-<start_ms>-<node>.jsonl.open``;
it is renamed to ``.jsonl`` when it passes ``max_bytes`` or ``max_age_ms``, or at shutdown. Readers
take the closed files (and may read the open one). A torn last line left by a crash is cut when
the next process starts, so readers never see half a record.

The journal is analytics, not the record: the store holds the truth, so lines are flushed to
the OS every ``flush_ms`` without fsync, and ``record`` never blocks or raises. The background
loop (``run``) hands each flush's write to a thread of its own: a write of a few megabytes can
wait on the kernel's dirty-page throttling, and the event loop serves producers meanwhile.

Every line has exactly these keys (null when not applicable), so one schema fits all files:

    event          scheduled | released | received | acked | nacked | expired | dead_lettered |
                   cancelled | rescheduled | failed | delivered
    time           ms since the epoch when the change happened
    node           the node that wrote it
    id, destination, topic, queue, message_id, correlation_id
    sent_at, deliver_at, expires_at   ms since the epoch
    size           body bytes
    failures       delivery failures so far
    reason         why (expired, rejected, maxlen, delivery_failed, queue_deleted, ...)
    lateness_ms    time - deliver_at, for released / delivered / received / expired
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

from tarry.config import JournalConfig
from tarry.journal.lines import encode_lines
from tarry.model.events import Event
from tarry.model.message import Message
from tarry.model.time import Clock

__all__ = ["Journal"]

log = logging.getLogger(__name__)


class Journal:
    def __init__(self, directory: Path, config: JournalConfig, *, clock: Clock, node: str) -> None:
        self.directory = directory
        self.config = config
        self.clock = clock
        self.node = node
        self.dropped = 0
        self.written = 0
        # One growing bytearray, not a list of batches: each batch's lines are freed as soon
        # as they are copied in, so the allocator reuses one warm block.
        self._buffer = bytearray()
        self._lines = 0
        self._file: IO[bytes] | None = None
        self._path: Path | None = None
        self._opened_ms = 0
        self._size = 0
        #: The write ``run`` handed to its thread, while under way: (lines written, dropped).
        self._writing: Future[tuple[int, int]] | None = None
        self._close_leftovers()

    # --- writing -------------------------------------------------------------------------------
    def record(
        self, event: str, message: Message, time_ms: int, queue: str | None, reason: str | None
    ) -> None:
        """The engine's event listener: buffer one line (no I/O here)."""
        self.record_many(((event, message, time_ms, queue, reason),))

    def record_many(self, events: Sequence[Event]) -> None:
        """The engine's event listener for a batch: buffer a line for each (no I/O here)."""
        data, lines, dropped = encode_lines(events, self.node)
        self._buffer += data
        self._lines += lines
        self.dropped += dropped

    def flush(self) -> None:
        """Write buffered lines to the current file (rotating first when it is due), on this
        thread, once the write ``run`` has under way (if any) is done: lines stay in order."""
        self._collect()
        data, lines = self._take()
        if data:
            self._count(*self._write(data, lines))

    async def run(self) -> None:
        with ThreadPoolExecutor(1, thread_name_prefix="tarry-journal") as executor:
            try:
                while True:
                    await asyncio.sleep(self.config.flush_ms / 1000)
                    data, lines = self._take()
                    if data:
                        self._writing = executor.submit(self._write, data, lines)
                        # Shielded: a cancel while the write waits its turn must not drop it;
                        # ``flush`` below waits for it, then writes what came after.
                        await asyncio.shield(asyncio.wrap_future(self._writing))
                        self._collect()
            finally:
                self.flush()

    def close(self) -> None:
        self.flush()
        self._close_current()

    def _take(self) -> tuple[bytearray, int]:
        """The buffered lines, the buffer emptied (on the event loop, where lines are added)."""
        data, lines = self._buffer, self._lines
        self._buffer, self._lines = bytearray(), 0
        return data, lines

    def _collect(self) -> None:
        """Wait for the write under way, if any, and count its lines."""
        writing, self._writing = self._writing, None
        if writing is not None:
            self._count(*writing.result())

    def _count(self, written: int, dropped: int) -> None:
        self.written += written
        self.dropped += dropped

    def _write(self, data: bytearray, lines: int) -> tuple[int, int]:
        """Append ``data`` (``lines`` lines), rotating first when it is due; (written, dropped).
        Only one write at a time touches the file (``flush`` waits for ``run``'s)."""
        try:
            if self._file is not None and self._due_for_rotation():
                self._close_current()
            if self._file is None:
                self._open_new()
            assert self._file is not None
            self._file.write(data)
            self._file.flush()
            self._size += len(data)
        except OSError as exc:
            log.warning("journal: dropped %d lines: %s", lines, exc)
            self._file = None
            return 0, lines
        return lines, 0

    # --- files ---------------------------------------------------------------------------------
    def _due_for_rotation(self) -> bool:
        return (
            self._size >= self.config.max_bytes
            or self.clock.now_ms() - self._opened_ms >= self.config.max_age_ms
        )

    def _open_new(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._opened_ms = self.clock.now_ms()
        path = self.directory / f"journal-{self._opened_ms}-{self.node}.jsonl.open"
        suffix = 0
        while path.exists() or path.with_suffix("").exists():
            suffix += 1
            path = self.directory / f"journal-{self._opened_ms}-{self.node}-{suffix}.jsonl.open"
        self._file = open(path, "ab")  # noqa: SIM115 - kept open across flushes
        self._path = path
        self._size = 0

    def _close_current(self) -> None:
        if self._file is None or self._path is None:
            return
        try:
            self._file.close()
            os.replace(self._path, self._path.with_suffix(""))
        except OSError as exc:
            log.warning("journal: could not close %s: %s", self._path, exc)
        self._file = None
        self._path = None

    def _close_leftovers(self) -> None:
        """Files a crashed process left open: cut a torn last line, then close them."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.jsonl.open")):
            try:
                data = path.read_bytes()
                end = data.rfind(b"\n") + 1
                if end < len(data):
                    with open(path, "r+b") as handle:
                        handle.truncate(end)
                    log.warning("journal: cut a torn line at the end of %s", path.name)
                os.replace(path, path.with_suffix(""))
            except OSError as exc:
                log.warning("journal: could not recover %s: %s", path.name, exc)
