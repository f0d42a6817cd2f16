"""The queue database's group commit on its own thread (``tarry.store.sqlite.database``)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tarry.errors import Unavailable
from tarry.store.sqlite.database import _RESTART_PATIENCE, WAL_KEEP_BYTES, Database


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    opened = Database(tmp_path / "q.db")
    await opened.open()
    yield opened
    await opened.close()


def _conflicting(conn: sqlite3.Connection) -> None:
    """A write that writes a row, then fails on a key conflict with it (undone whole)."""
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute("INSERT INTO t VALUES (1)")


async def _bodies_database(
    tmp_path: Path, *, wal_keep_bytes: int = WAL_KEEP_BYTES
) -> tuple[Database, Path]:
    """An opened queue database with a table of bodies, and the path of its WAL."""
    db = Database(tmp_path / "q.db", queues_only=True, wal_keep_bytes=wal_keep_bytes)
    await db.open()
    await db.write(lambda conn: conn.execute("CREATE TABLE bodies (b BLOB)"))
    return db, tmp_path / "q.db-wal"


async def test_writes_arriving_during_a_commit_are_committed_without_the_event_loop(
    db: Database,
) -> None:
    # Given a write that holds the database thread, and a second one submitted meanwhile
    inside = threading.Event()
    second_ran_at: list[float] = []

    def first(conn: sqlite3.Connection) -> int:
        inside.set()
        time.sleep(0.05)
        return 1

    def second(conn: sqlite3.Connection) -> int:
        second_ran_at.append(time.monotonic())
        return 2

    one = asyncio.ensure_future(db.write(first))
    await asyncio.sleep(0)
    assert await asyncio.to_thread(inside.wait, 5)
    two = asyncio.ensure_future(db.write(second))
    await asyncio.sleep(0)  # the second write is queued
    # When the event loop is busy (blocked) well past the first commit
    blocked_until = time.monotonic() + 0.2
    time.sleep(0.2)
    # Then the thread went on to the second write by itself, and both callers get theirs
    assert second_ran_at and second_ran_at[0] < blocked_until
    assert await one == 1 and await two == 2


async def test_a_first_write_goes_ahead_of_the_writes_waiting_and_of_the_rest_of_a_batch(
    db: Database,
) -> None:
    # Given writes queued behind one that holds the database thread, so that they run as one
    # transaction, the first of them holding the thread in turn
    ran: list[str] = []
    holding = {name: threading.Event() for name in ("x", "n1")}
    inside = {name: threading.Event() for name in ("x", "n1")}

    def write(name: str) -> Callable[[sqlite3.Connection], str]:
        def work(conn: sqlite3.Connection) -> str:
            ran.append(name)
            if name in holding:
                inside[name].set()
                assert holding[name].wait(5)
            conn.execute("CREATE TABLE IF NOT EXISTS t (name TEXT)")
            conn.execute("INSERT INTO t VALUES (?)", (name,))
            return name

        return work

    x = asyncio.ensure_future(db.write(write("x")))
    assert await asyncio.to_thread(inside["x"].wait, 5)
    normal = [asyncio.ensure_future(db.write(write(n))) for n in ("n1", "n2", "n3")]
    await asyncio.sleep(0)
    holding["x"].set()
    assert await asyncio.to_thread(inside["n1"].wait, 5)
    # When a release comes while that transaction runs its first write
    release = asyncio.ensure_future(db.write(write("release"), first=True))
    await asyncio.sleep(0)
    holding["n1"].set()
    # Then the transaction ends after that write, the release runs next, then the rest
    assert await release == "release"
    assert [await w for w in (x, *normal)] == ["x", "n1", "n2", "n3"]
    assert ran == ["x", "n1", "release", "n2", "n3"]
    rows = await db.read(lambda conn: conn.execute("SELECT name FROM t ORDER BY rowid").fetchall())
    assert [r[0] for r in rows] == ran


async def test_a_first_write_that_fails_fails_alone(db: Database) -> None:
    await db.write(lambda conn: conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)"))

    results = await asyncio.gather(
        db.write(lambda conn: conn.execute("INSERT INTO t VALUES (2)")),
        db.write(_conflicting, first=True),
        db.write(lambda conn: conn.execute("INSERT INTO t VALUES (3)"), first=True),
        return_exceptions=True,
    )
    assert isinstance(results[1], Unavailable)
    rows = await db.read(lambda conn: conn.execute("SELECT x FROM t ORDER BY x").fetchall())
    assert rows == [(2,), (3,)]


async def test_a_failing_write_fails_alone_and_the_others_of_its_batch_commit(
    db: Database,
) -> None:
    await db.write(lambda conn: conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)"))

    results = await asyncio.gather(
        db.write(lambda conn: conn.execute("INSERT INTO t VALUES (2)")),
        db.write(_conflicting),
        db.write(lambda conn: conn.execute("INSERT INTO t VALUES (3)")),
        return_exceptions=True,
    )
    assert isinstance(results[1], Unavailable)
    rows = await db.read(lambda conn: conn.execute("SELECT x FROM t ORDER BY x").fetchall())
    assert rows == [(2,), (3,)]


async def test_a_failing_write_alone_in_its_transaction_leaves_nothing_and_the_next_commits(
    db: Database,
) -> None:
    # Given a table, and a write alone in its transaction (no savepoint of its own) that
    # writes a row and then fails
    await db.write(lambda conn: conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)"))

    # When it runs, then it fails and its row is gone
    with pytest.raises(Unavailable):
        await db.write(_conflicting)
    # and the next write alone, and one that raises something else, still work as before
    await db.write(lambda conn: conn.execute("INSERT INTO t VALUES (2)"))

    def raises(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (3)")
        raise Unavailable("refused")

    with pytest.raises(Unavailable, match="refused"):
        await db.write(raises)
    rows = await db.read(lambda conn: conn.execute("SELECT x FROM t ORDER BY x").fetchall())
    assert rows == [(2,)]
    assert await db.write(lambda conn: conn.in_transaction) is True


async def test_many_concurrent_writes_all_commit_and_close_waits_for_them(tmp_path: Path) -> None:
    db = Database(tmp_path / "q.db")
    await db.open()
    await db.write(lambda conn: conn.execute("CREATE TABLE t (x INTEGER)"))
    writes = [
        asyncio.ensure_future(
            db.write(lambda conn, i=i: conn.execute("INSERT INTO t VALUES (?)", (i,)))
        )
        for i in range(500)
    ]
    await asyncio.sleep(0)
    await db.close()
    assert all(w.done() and not w.exception() for w in writes)
    again = Database(tmp_path / "q.db")
    await again.open()
    try:
        assert await again.read(lambda conn: conn.execute("SELECT count(*) FROM t").fetchone()) == (
            500,
        )
    finally:
        await again.close()


async def test_finding_08_a_checkpointed_wal_gives_back_its_copies_of_the_bodies(
    tmp_path: Path,
) -> None:
    # Given a database that keeps a WAL of 4 MB and took a 16 MB burst of bodies (every one
    # of them in the WAL)
    db, wal = await _bodies_database(tmp_path, wal_keep_bytes=4 * 1024 * 1024)
    for _ in range(8):
        await db.write(
            lambda conn: conn.executemany("INSERT INTO bodies VALUES (?)", [(bytes(20_000),)] * 100)
        )
    assert wal.stat().st_size > 8_000_000
    # When the checkpointer has copied it into the database and the next write reuses the WAL
    deadline = time.monotonic() + 10
    while wal.stat().st_size > 4 * 1024 * 1024 + 100_000:
        assert time.monotonic() < deadline, wal.stat().st_size
        await asyncio.sleep(0.6)
        await db.write(lambda conn: conn.execute("INSERT INTO bodies VALUES (x'00')"))
    # Then the WAL is cut back, not kept at its largest as a second copy of the burst
    assert (tmp_path / "q.db").stat().st_size > 16_000_000
    await db.close()


async def test_issue_23_a_wal_started_over_within_what_it_keeps_is_not_cut_back(
    tmp_path: Path,
) -> None:
    # Given a WAL of 8 MB, less than the database keeps (what steady traffic gathers between
    # two copies)
    db, wal = await _bodies_database(tmp_path)
    for _ in range(4):
        await db.write(
            lambda conn: conn.executemany("INSERT INTO bodies VALUES (?)", [(bytes(20_000),)] * 100)
        )
    grown = wal.stat().st_size
    assert 8_000_000 < grown < WAL_KEEP_BYTES
    # When the checkpointer has copied it back and later writes start it over
    deadline = time.monotonic() + 10
    header = wal.read_bytes()[:32]
    while wal.read_bytes()[:32] == header:  # a WAL started over has a header of its own
        assert time.monotonic() < deadline
        await asyncio.sleep(0.3)
        await db.write(lambda conn: conn.execute("INSERT INTO bodies VALUES (x'00')"))
    # Then the file is not cut back (a write before the start-over may have added a frame):
    # freeing its blocks is a synchronous discard on a disk mounted with it, inside a COMMIT,
    # with releases waiting
    assert wal.stat().st_size >= grown, (wal.stat().st_size, grown)
    await db.close()


@pytest.mark.parametrize("copied_s_ago", [0.0, 0.2])
async def test_a_busy_writer_starts_the_wal_over_only_just_after_a_copy(
    tmp_path: Path, copied_s_ago: float
) -> None:
    # Given a WAL the checkpointer has long found worth starting over (never an idle moment
    # for the writer), and its last copy made just now or a fifth of a second ago
    db, _ = await _bodies_database(tmp_path)
    restarts: list[bool] = []
    restart = db._restart_wal

    def recorded() -> None:
        restarts.append(bool(db._pending or db._first))  # whether writes wait
        restart()

    db._restart_wal = recorded  # type: ignore[method-assign]
    db._restart_rounds = _RESTART_PATIENCE + 1

    def slow(conn: sqlite3.Connection) -> None:
        time.sleep(0.05)  # writes come in meanwhile
        db._copied_at = time.monotonic() - copied_s_ago

    # When a write ends with others waiting behind it
    first = asyncio.ensure_future(db.write(slow))
    await asyncio.sleep(0.01)
    await asyncio.gather(first, *(db.write(_nothing) for _ in range(3)))
    await db.close()
    # Then the writer starts the WAL over at once only after a fresh copy (what is left to
    # copy is little); after a stale one it waits for a moment nothing waits
    assert restarts[:1] == ([True] if copied_s_ago == 0.0 else [False]), restarts


def _nothing(conn: sqlite3.Connection) -> None:
    pass


async def test_an_idle_writer_starts_the_wal_over_right_after_a_copy(tmp_path: Path) -> None:
    # Given a WAL grown past what is worth starting over, then no write at all
    db, _ = await _bodies_database(tmp_path)
    restarts: list[float] = []
    restart = db._restart_wal

    def recorded() -> None:
        restarts.append(time.monotonic() - db._copied_at)
        restart()

    db._restart_wal = recorded  # type: ignore[method-assign]
    batch = [(bytes(2_000),)] * 1_000
    await db.write(lambda conn: conn.executemany("INSERT INTO bodies VALUES (?)", batch))
    # When the checkpointer copies it back
    for _ in range(100):
        if restarts:
            break
        await asyncio.sleep(0.02)
    await db.close()
    # Then the writer, told so, starts it over at once, with nothing left to copy
    assert restarts and restarts[0] < 0.02, restarts


async def test_a_stale_copy_waits_for_the_next_one(tmp_path: Path) -> None:
    # Given a WAL the checkpointer found worth starting over a fifth of a second ago
    db, _ = await _bodies_database(tmp_path)
    restarts: list[int] = []
    db._restart_wal = lambda: restarts.append(1)  # type: ignore[method-assign]
    db._restart_rounds, db._copied_at = 1, time.monotonic() - 0.2
    # When writes come and go with idle moments between them
    for _ in range(3):
        await db.write(_nothing)
    await db.close()
    # Then none of those moments starts it over (all that was written since is left to copy)
    assert restarts == []


async def test_issue_23_under_steady_writes_the_wal_starts_over_and_stays_small(
    tmp_path: Path,
) -> None:
    # Given a write every few milliseconds, never a moment with the WAL wholly copied back
    # between two of them (so the checkpointer alone never lets it start over)
    db, wal = await _bodies_database(tmp_path)
    batch = [(bytes(2_000),)] * 40
    written = largest = 0
    began = time.monotonic()
    # When 48 MB go through it
    while written < 48_000_000:
        await db.write(lambda conn: conn.executemany("INSERT INTO bodies VALUES (?)", batch))
        written += 80_000
        largest = max(largest, wal.stat().st_size)
        await asyncio.sleep(0.002)
    await db.close()
    # Then the WAL kept starting over: it never held more than a part of them. Without the
    # writer's share it holds all that went through (56 MB here, on to wal_autocheckpoint's
    # 82 MB, cut back inside a COMMIT); with it, 10-13 MB alone, and up to 22 MB while the
    # suite's other worker writes beside it (the checkpointer's syncs wait on the disk).
    assert largest < 32_000_000, largest
    # (the checkpointer told the writer when it copied: a busy writer's cue, see above)
    assert db._copied_at > began
    again = Database(tmp_path / "q.db", queues_only=True)
    await again.open()
    try:
        count = await again.read(
            lambda conn: conn.execute("SELECT count(*) FROM bodies").fetchone()
        )
        assert count == (48_000_000 // 80_000 * 40,)
    finally:
        await again.close()
