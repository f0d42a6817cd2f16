"""One SQLite connection on one thread, with group commit.

Every operation runs on a single dedicated thread (SQLite connections are not shared between
threads). Writes submitted while a commit is in progress are gathered into the next transaction,
each in its own SAVEPOINT, so concurrent producers share one fsync without sharing failures:
a write that raises is rolled back alone.

Durability is chosen per write: accepting a producer's message (``durable=True``) fsyncs the
commit under ``synchronous = full``; moving messages between states (release, receive, ack,
sweep) commits without fsync (SQLite's NORMAL in WAL mode: consistent, survives a crash of the
process, may replay the last moves after a power loss — at-least-once, never lost).

WAL checkpoints run on a second connection in their own thread so they do not stall commits,
but under steady writes that alone never lets the WAL start over: SQLite restarts it only at a
write that begins with every frame already copied back, and the checkpointer always finishes
behind the writer. The WAL then grew to ``wal_autocheckpoint`` and the write crossing it
copied, synced and cut back the whole file inside its COMMIT, everything else waiting behind it.
So the two share the work (``_checkpoint_loop``, ``_restart_wal``): the checkpointer copies
what it can and flushes the database file, and the writer, right after (at once when idle,
else between two batches), copies the few frames written since on its own connection; the
next write starts the WAL over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tarry.errors import StorageFault, TarryError, Unavailable
from tarry.store.faults import storage_fault
from tarry.store.sqlite.pending_receives import PendingReceives
from tarry.store.sqlite.row_memory import RowMemory
from tarry.store.sqlite.schema import is_keyed, migrate
from tarry.store.sqlite.worker import Worker

__all__ = ["WAL_KEEP_BYTES", "Connection", "Database"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Connection(sqlite3.Connection):
    """A connection that knows how its ``messages`` table finds rows by id
    (``tarry.store.sql.id_column``)."""

    #: Rows are found through ``key`` (a queue database of its own), not ``id``.
    keyed = False
    #: The writing connection's memory of the rows releases wrote, by ``seq``, and of those
    #: receives handed out, by row key (``row_memory``).
    released: RowMemory | None = None
    handed_out: RowMemory | None = None
    #: Receives whose rows are not written yet (a queue database of its own).
    pending_receives: PendingReceives | None = None


Work = Callable[[Connection], Any]
#: A write waiting for the database thread: its work, its caller's future, whether durable,
#: whether it takes receives' unwritten claims into account itself (``write``).
Job = tuple[Work, "asyncio.Future[Any]", bool, bool]
#: Batches the database thread commits before it lets other work in (``_flush``).
_BATCHES_IN_A_ROW = 16
#: The size a started-over WAL is cut back to once it grew past it. Not smaller: under steady
#: traffic the WAL gathers several MB between two copies, and cutting a file back frees its
#: blocks, which a filesystem that discards freed blocks at once (ext4 mounted with
#: ``discard``) does synchronously, inside the writer's COMMIT, every release waiting behind
#: it. So only what a burst grew beyond this is given back.
WAL_KEEP_BYTES = 64 * 1024 * 1024
#: How often the checkpointer copies the WAL back: what the WAL holds when it starts over is
#: what it gathers in this time, and the writer's share grows with it.
_CHECKPOINT_EVERY_S = 0.25
#: Frames in the WAL past which it is started over (a smaller WAL is left to grow: starting
#: over costs the writer a checkpoint of its own, two syncs).
_RESTART_FRAMES = 256
#: The writer starts the WAL over this soon after the checkpointer's copy, so that it copies
#: only what was written since, not up to a round's frames while releases wait behind it.
_RESTART_FRESH_S = 0.02
#: Checkpointer rounds after which an idle writer starts over however stale the copy (it
#: missed every fresh moment: writes are few, so is what is left to copy).
_RESTART_PATIENCE = 4


class Database:
    def __init__(
        self,
        path: Path | None,
        *,
        synchronous: str = "full",
        max_pages: int | None = None,
        queues_only: bool = False,
        wal_keep_bytes: int = WAL_KEEP_BYTES,
    ):
        """``path`` None keeps everything in memory (nothing survives the process);
        ``queues_only``: a queue database of its own, its rows keyed in release order
        (``schema.migrate``); ``wal_keep_bytes``: see ``WAL_KEEP_BYTES``."""
        self.path = path
        self._wal_keep_bytes = wal_keep_bytes
        self._queues_only = queues_only
        self._synchronous = synchronous
        self._max_pages = max_pages
        self._writer = Worker("tarry-db_0")
        # Reads run on their own connection and thread (WAL readers do not wait for the
        # writer), so the dispatcher's look at the due index never queues behind commits.
        self._read_worker = Worker("tarry-db-read_0")
        self._reader: Connection | None = None
        self._conn: Connection | None = None
        self._pending: list[Job] = []
        #: Writes that go ahead of ``_pending`` (``write(first=True)``: releases).
        self._first: list[Job] = []
        self._checkpointer: threading.Thread | None = None
        self._closing = threading.Event()
        self._flushing = False
        #: Guards ``_pending`` and ``_flushing``, shared by the event loop and the thread.
        self._lock = threading.Lock()
        self._level = ""
        self.commits = 0
        #: The last batch met a disk fault (``_give_back_wal`` before the next one).
        self._refused = False
        #: Checkpointer rounds since it found the WAL worth starting over, 0 when not
        #: (``_restart_wal``); set by the checkpointer's thread, cleared by the writer's.
        self._restart_rounds = 0
        #: When the checkpointer last copied the WAL back (``time.monotonic``), set with
        #: ``_restart_rounds``.
        self._copied_at = 0.0
        #: The event loop's call that writes claims left unwritten (``_write_claims_later``).
        self._claims_call: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        await self._writer.call(self._open)
        if self.path is not None:
            self._reader = await self._read_worker.call(self._open_reader)

    def _open_reader(self) -> Connection:
        conn = _connect(str(self.path))
        conn.execute("PRAGMA cache_size=-32768")
        conn.execute("PRAGMA query_only=ON")
        conn.keyed = is_keyed(conn)
        return conn

    def _open(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = _connect(":memory:" if self.path is None else str(self.path))
        conn.execute("PRAGMA journal_mode=WAL")
        # full: the WAL is fsynced at every commit, so a 201 means the message is on disk.
        conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        self._level = self._synchronous.upper()
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("PRAGMA cache_size=-65536")
        conn.execute("PRAGMA temp_store=MEMORY")
        if self._max_pages is not None:
            conn.execute(f"PRAGMA max_page_count={int(self._max_pages)}")
        # The checkpointer thread keeps the WAL short; this is only the safety net.
        conn.execute("PRAGMA wal_autocheckpoint=20000")
        # Once checkpointed, a WAL a burst grew is cut back when it is reused: otherwise the
        # file keeps its largest size, a second copy of every body the burst wrote.
        conn.execute(f"PRAGMA journal_size_limit={int(self._wal_keep_bytes)}")
        migrate(conn, queues_only=self._queues_only)
        conn.keyed = is_keyed(conn)
        # A queue database of its own takes released messages as new rows, worth remembering;
        # the SQLite store's release changes rows it already holds.
        conn.released = RowMemory() if self._queues_only else None
        conn.handed_out = RowMemory()
        # The SQLite store's own reads (the due messages, every release round) would each
        # write the claims first: there every receive writes its rows at once.
        conn.pending_receives = PendingReceives() if self._queues_only else None
        self._conn = conn
        if self.path is not None:
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name="tarry-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        """Copy the WAL back into the database file and flush the file; once the WAL is worth
        starting over, copy again what the writer wrote meanwhile and ask the writer to finish
        the copy (``_restart_wal``).

        Both keep the writer's share short: it copies only what was written during the second
        copy, and syncs only that (SQLite syncs the database file only at a checkpoint that
        copies the whole WAL, which this one, behind the writer, seldom does)."""
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        database = os.open(str(self.path), os.O_RDONLY)
        try:
            conn.execute("PRAGMA busy_timeout=100")
            while not self._closing.wait(_CHECKPOINT_EVERY_S):
                try:
                    if _copy_back(conn, database) >= _RESTART_FRAMES:
                        _copy_back(conn, database)
                        self._copied_at = time.monotonic()
                        self._restart_rounds += 1
                        if not self._closing.is_set():
                            self._writer.put(self._restart_soon)
                except (sqlite3.Error, OSError) as exc:
                    log.debug("checkpoint skipped: %s", exc)
        finally:
            os.close(database)
            conn.close()

    async def close(self) -> None:
        if self._claims_call is not None:
            self._claims_call.cancel()
            self._claims_call = None
        while True:
            while self._pending or self._first or self._flushing:
                await asyncio.sleep(0.005)
            if self._conn is None or not self._conn.pending_receives:
                break
            await self.write(_nothing)  # writes the claims (see ``write``)
        self._closing.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await self._read_worker.call(reader.close)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._writer.call(conn.close)
        self._read_worker.stop()
        self._writer.stop()

    async def read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on the reading connection; it sees every committed write, and every
        receive's rows written (``pending_receives``: unwritten claims are written first)."""
        writer = self._require()
        if writer.pending_receives:
            await self.write(_nothing)
        try:
            if self._reader is None:  # an in-memory database has one connection only
                return await self._writer.call(work, writer)
            return await self._read_worker.call(work, self._reader)
        except sqlite3.Error as exc:
            raise _unavailable(exc) from exc

    async def write(
        self,
        work: Callable[[Connection], T],
        *,
        durable: bool = False,
        first: bool = False,
        claims_aware: bool = False,
    ) -> T:
        """Run ``work`` inside a transaction shared with other concurrent writes; return once
        the transaction is committed, and fsynced when ``durable`` (see the module docstring).

        ``first`` (a release: messages already due) goes ahead of the other writes waiting:
        into a transaction of its own, the next one, and a transaction of other writes under
        way ends after the write it is running, commits, and leaves the rest for after it. A
        release then waits for at most one consumer's receive or ack, not for all those queued.

        ``claims_aware``: ``work`` takes receives' unwritten claims into account itself (a
        receive, an ack, a release; ``pending_receives``). Any other write has every claim
        written before it runs, in its transaction."""
        return await self._submit(work, durable=durable, first=first, claims_aware=claims_aware)

    def _submit(
        self, work: Callable[[Connection], T], *, durable: bool, first: bool, claims_aware: bool
    ) -> asyncio.Future[T]:
        self._require()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            queue = self._first if first else self._pending
            queue.append((work, future, durable, claims_aware))
            start = not self._flushing
            self._flushing = True
        if start:
            self._writer.put(lambda: self._flush(loop))
        return future

    def _settled(
        self, batch: list[Job], results: list[tuple[bool, Any]], since: float | None
    ) -> None:
        """On the event loop, after a batch: each write's result to its caller; claims left
        unwritten (their oldest made at ``since``) written in time (``_write_claims_later``)."""
        _settle(batch, results)
        if since is not None:
            self._write_claims_later(since)

    def _write_claims_later(self, since: float) -> None:
        """On the event loop, after a batch left claims unwritten: a write (of nothing) once
        the oldest is ``write_after_s`` old, which writes those that old (as every
        transaction does, ``_run_batch``: this one is for when none comes)."""
        conn = self._conn
        claims = None if conn is None else conn.pending_receives
        if self._claims_call is not None or not claims or self._closing.is_set():
            return
        delay = since + claims.write_after_s - time.monotonic()
        self._claims_call = asyncio.get_running_loop().call_later(
            max(delay, 0.0), self._write_claims_now
        )

    def _write_claims_now(self) -> None:
        self._claims_call = None
        conn = self._conn
        if conn is None or not conn.pending_receives or self._closing.is_set():
            return
        # Aware of claims: it writes those old enough, not a receive's just made.
        future = self._submit(_nothing, durable=False, first=False, claims_aware=True)
        # Nobody waits for it: a failure is the next write's to meet (the claims stay).
        future.add_done_callback(_ignore)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the database thread: commit batch after batch while writes are pending. The
        thread takes the next batch itself rather than through the event loop, which under
        load is busy for a millisecond or more between two looks: a release or a consumer's
        ack waited for that as well as for the transactions ahead of it. After a few batches
        it steps aside (queues itself again), so other work handed to the thread (``open``, an
        in-memory database's reads) is not starved."""
        for _ in range(_BATCHES_IN_A_ROW):
            with self._lock:
                first = bool(self._first)
                if first:
                    batch, self._first = self._first, []
                else:
                    batch, self._pending = self._pending, []
                if not batch:
                    self._flushing = False
                    return
            try:
                if self._refused:
                    self._give_back_wal()
                results = self._run_batch(batch, yields=not first)
            except BaseException as exc:  # the commit itself failed: nothing was stored
                error = _unavailable(exc) if isinstance(exc, sqlite3.Error) else exc
                results = [(False, error)] * len(batch)
            if len(results) < len(batch):  # it made way for a ``first`` write: the rest waits
                with self._lock:
                    self._pending[:0] = batch[len(results) :]
                batch = batch[: len(results)]
            self._refused = any(isinstance(value, StorageFault) for _, value in results)
            # One hand-back a batch (each wakes the loop): the results, and when claims are
            # left, the time of the oldest (read here, where alone they change).
            claims = self._require().pending_receives
            since = claims.oldest_since() if claims else None
            loop.call_soon_threadsafe(self._settled, batch, results, since)
            if self._restart_rounds and self._may_restart(idle=not (self._pending or self._first)):
                self._restart_wal()
        self._writer.put(lambda: self._flush(loop))

    def _may_restart(self, *, idle: bool) -> bool:
        """Whether the writer, between two batches, starts over the WAL the checkpointer found
        worth it: just after its copy (``_RESTART_FRESH_S``), when what is left to copy is
        little, whether or not writes wait; or, idle, once it missed that for
        ``_RESTART_PATIENCE`` rounds. Never on a stale copy while writes wait behind it."""
        if time.monotonic() - self._copied_at < _RESTART_FRESH_S:
            return True
        return idle and self._restart_rounds > _RESTART_PATIENCE

    def _restart_soon(self) -> None:
        """On the database thread, handed over by the checkpointer right after its copy: start
        the WAL over now, between two batches, while the copy is fresh (an idle writer has no
        batch that ends to do it, ``_may_restart``)."""
        if self._restart_rounds and self._conn is not None and self._may_restart(idle=False):
            self._restart_wal()

    def _restart_wal(self) -> None:
        """On the database thread, between two batches: copy back the frames the checkpointer
        left (those written since it began), so that the next write starts the WAL over at its
        first frame. The writer is the only one that can: no write gets in between.

        SQLite syncs the WAL before it copies and the database file after, so a commit is
        never overwritten before its pages are on disk. The start-over reuses the file from
        its start (cut back only if it outgrew ``journal_size_limit``). A reader still on an
        older snapshot holds frames back; the next round tries again."""
        self._restart_rounds = 0
        try:
            self._require().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            log.debug("checkpoint before a WAL start-over skipped: %s", exc)

    def _give_back_wal(self) -> None:
        """After the disk refused a write: checkpoint the whole WAL into the database and
        truncate it, before the next batch. The WAL holds older copies of the pages a burst
        rewrote; giving them back is often what lets the next write through, and the periodic
        checkpoint cannot do it while writes keep appending to the WAL."""
        try:
            self._require().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            log.debug("WAL checkpoint after a refused write failed: %s", exc)

    def _run_batch(self, batch: list[Job], *, yields: bool = False) -> list[tuple[bool, Any]]:
        """Run ``batch`` in one transaction, each write in a savepoint; one result per write
        run. With ``yields`` it stops early, after at least one write, once a ``first`` write
        waits (the writes not run get no result)."""
        conn = self._require()
        results: list[tuple[bool, Any]] = []
        durable = any(d for _, _, d, _ in batch)
        level = self._synchronous.upper() if durable else "NORMAL"
        if level != self._level:
            conn.execute(f"PRAGMA synchronous={level}")
            self._level = level
        # A write alone in its transaction needs no savepoint: if it fails, the transaction
        # is rolled back whole (a consumer's receive or ack is often alone, and each statement
        # is a hand-over of the GIL).
        alone = len(batch) == 1
        claims = conn.pending_receives
        conn.execute("BEGIN IMMEDIATE")
        try:
            if claims:
                # Claims old enough, or all of them before a write that would not see them.
                if all(aware for _, _, _, aware in batch):
                    claims.write_older(conn)
                else:
                    claims.write_all(conn)
            for work, _, _, _ in batch:
                mark = claims.mark() if claims is not None else 0
                if not alone:
                    conn.execute("SAVEPOINT w")
                try:
                    results.append((True, work(conn)))
                except Exception as exc:
                    if not isinstance(exc, TarryError | sqlite3.Error):
                        log.exception("store write failed")  # a bug: keep it apart from others
                    if not conn.in_transaction:
                        # SQLite rolled the whole transaction back (e.g. a full disk): every
                        # write of this batch is gone, so every one of them must fail.
                        raise
                    error = _unavailable(exc) if isinstance(exc, sqlite3.Error) else exc
                    results.append((False, error))
                    if alone:
                        conn.execute("ROLLBACK")
                        if claims is not None:
                            claims.undo_to(0)
                        return results
                    conn.execute("ROLLBACK TO w")
                    if claims is not None:
                        claims.undo_to(mark)
                if not alone:
                    conn.execute("RELEASE w")
                if yields and self._first:
                    break
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if claims is not None:
                claims.undo_to(0)
            raise
        if claims is not None:
            claims.commit()
        self.commits += 1
        return results

    def _require(self) -> Connection:
        if self._conn is None:
            raise Unavailable("the store is not open; wait for the server to finish starting")
        return self._conn


def _settle(batch: list[Job], results: list[tuple[bool, Any]]) -> None:
    """On the event loop: each write's result (or error) to its caller."""
    for (_, future, _, _), (ok, value) in zip(batch, results, strict=True):
        if future.done():  # its caller went away (cancelled)
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _nothing(conn: Connection) -> None:
    """A write of nothing: its transaction writes the claims (``write``)."""


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _copy_back(conn: sqlite3.Connection, database: int) -> int:
    """A PASSIVE checkpoint on ``conn``, then the database file (``database``, a descriptor)
    flushed to disk once it holds frames copied back; the frames the WAL holds."""
    ((_, frames, copied),) = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    if copied > 0:
        os.fdatasync(database)
    return int(frames)


def _connect(target: str) -> Connection:
    return sqlite3.connect(
        target, isolation_level=None, check_same_thread=False, factory=Connection
    )


def _unavailable(exc: BaseException) -> Unavailable:
    fault = storage_fault(exc, what="the SQLite database")
    return fault or Unavailable(
        f"the store cannot take writes now ({exc}); nothing was stored, retry later"
    )
