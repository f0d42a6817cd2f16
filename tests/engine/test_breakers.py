"""A real store fault (the SQLite file cannot grow) opens the store breaker: producers get
`unavailable`, /healthz says degraded, nothing accepted is lost, and the engine recovers alone."""

from __future__ import annotations

import sqlite3

import pytest

from tarry.errors import Unavailable


def set_max_pages(engine, pages: int) -> None:
    engine.qdb.db._require().execute(f"PRAGMA max_page_count={pages}")


async def test_a_full_store_refuses_sends_with_unavailable_then_recovers(
    make_engine, clock
) -> None:
    engine = await make_engine(
        {"dispatch": {"time_to_trigger_store_ms": 1000}, "store": {"engine": "sqlite"}}
    )
    await engine.declare_queue("q", {})
    kept = await engine.send({"destination": "q", "body": "kept", "delay_ms": 10})
    pages = await engine.qdb.read(lambda c: c.execute("PRAGMA page_count").fetchone()[0])

    # Given a store that cannot grow any more
    await engine.qdb.read(lambda c: set_max_pages(engine, pages))
    big = "x" * 200_000
    with pytest.raises(Unavailable, match="disk full"):
        await engine.send({"destination": "q", "body": big})
    # A disk fault opens the breaker at once (waiting out time_to_trigger would not clear it)
    health = engine.health()
    assert health["status"] == "degraded" and "store" in health["open"]
    assert health["reasons"]["store"].startswith("disk full")
    with pytest.raises(Unavailable, match="disk full"):
        await engine.send({"destination": "q", "body": big})

    # When the fault clears
    await engine.qdb.read(lambda c: set_max_pages(engine, 1_000_000))
    await engine.send({"destination": "q", "body": big})
    # Then the breaker closes and what was accepted before is intact
    assert engine.health()["status"] == "ok"
    clock.advance(10)
    await engine.dispatcher.run_once()
    bodies = sorted(d.message.body[:4] for d in await engine.receive("q", max_messages=10))
    assert bodies == [b"kept", b"xxxx"]
    assert (await engine.get_message(kept.id)).state.value == "delivered"


def test_sqlite_reports_a_full_database_as_an_operational_error() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (b BLOB)")
    conn.execute("PRAGMA max_page_count=3")
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))


@pytest.mark.parametrize("engine_store", ["log"])
async def test_a_background_loop_that_ends_by_mistake_is_started_again(make_engine) -> None:
    # Given an engine and a background loop that fails on its first run, then on its second is
    # cancelled by something other than the engine (a library raising CancelledError)
    import asyncio

    engine = await make_engine()
    runs: list[int] = []
    resumed = asyncio.Event()

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("a bug")
        if len(runs) == 2:
            raise asyncio.CancelledError()
        resumed.set()
        await asyncio.Event().wait()

    # When it runs under the engine's supervision
    engine._spawn(loop)
    # Then it is started again each time, and stop() still ends it
    await asyncio.wait_for(resumed.wait(), timeout=10)
    assert runs == [0, 1, 2]
    await engine.stop()
    assert all(task.done() for task in engine._tasks) and not engine._tasks
