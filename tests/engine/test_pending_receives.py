"""A receive's claim on its rows, kept in memory and written later or never
(``store/sqlite/pending_receives.py``): what everything else sees is the table as if each receive
had written its rows at once. The log store's queue database keeps claims; the SQLite store
writes each receive at once, and the same tests hold there."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tarry.store.sqlite.database import Database
from tarry.store.sqlite.pending_receives import PendingReceives


def _claims(engine: Any) -> PendingReceives | None:
    claims: PendingReceives | None = engine.qdb.db._conn.pending_receives
    return claims


def _row(engine: Any, message_id: str) -> dict[str, Any]:
    """The message's row as a separate connection reads it from the file (committed only)."""
    path = engine.qdb.db.path
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        found = conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        assert found is not None
        return dict(found)


async def test_a_receive_of_the_log_stores_queue_database_is_kept_as_a_claim(
    make_engine,
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "a"})
    [d] = await engine.receive("q")
    claims = _claims(engine)
    if claims is None:  # the SQLite store: written at once
        assert _row(engine, d.message.id)["state"] == "delivered"
        return
    assert len(claims) == 1
    assert _row(engine, d.message.id)["state"] == "ready"  # not written
    # Reading the message has the claim written first: it is in flight, counted once.
    seen = await engine.get_message(d.message.id)
    assert seen.state.value == "delivered"
    assert len(claims) == 0
    row = _row(engine, d.message.id)
    assert (row["state"], row["receipt"], row["delivery_count"]) == ("delivered", d.receipt, 1)


async def test_an_ack_of_a_claim_leaves_the_row_a_written_receive_and_ack_leave(
    make_engine,
) -> None:
    # The same two messages, one received with a visibility timeout too short to keep as a
    # claim (written at once), one kept; each acked. Their rows must end the same.
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send_batch([{"destination": "q", "body": "same"} for _ in range(2)])
    [written] = await engine.receive("q", visibility_ms=999)
    [kept] = await engine.receive("q", visibility_ms=1000)
    claims = _claims(engine)
    assert claims is None or len(claims) == 1
    assert (await engine.ack("q", [written.receipt, kept.receipt])) == {"acked": 2, "unknown": []}
    assert claims is None or len(claims) == 0
    rows = [_row(engine, d.message.id) for d in (written, kept)]
    for row in rows:
        assert (row["state"], row["body"], row["receipt"]) == ("acked", None, None)
        assert (row["delivery_count"], row["redelivered"]) == (1, 0)
    differ = {"id", "key", "seq", "sent_at_ms", "deliver_at_ms", "visible_at_ms"}
    assert {k: v for k, v in rows[0].items() if k not in differ} == {
        k: v for k, v in rows[1].items() if k not in differ
    }
    assert rows[1]["visible_at_ms"] == rows[0]["visible_at_ms"] + 1
    # Acked once: the same receipts again name nothing in flight.
    again = await engine.ack("q", [written.receipt, kept.receipt])
    assert again == {"acked": 0, "unknown": [written.receipt, kept.receipt]}


async def test_two_receives_never_take_the_same_claimed_rows(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send_batch([{"destination": "q", "body": str(i)} for i in range(5)])
    first = await engine.receive("q", max_messages=2)
    second = await engine.receive("q", max_messages=10)
    assert [d.message.body for d in first] == [b"0", b"1"]
    assert [d.message.body for d in second] == [b"2", b"3", b"4"]
    assert await engine.receive("q", max_messages=10) == []
    receipts = [d.receipt for d in [*first, *second]]
    assert (await engine.ack("q", receipts))["acked"] == 5


async def test_a_nack_of_a_claim_requeues_it_as_a_delivered_message(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "a"})
    [d] = await engine.receive("q")
    assert (await engine.nack("q", [d.receipt], requeue=True)) == {"nacked": 1, "unknown": []}
    claims = _claims(engine)
    assert claims is None or len(claims) == 0
    [again] = await engine.receive("q")
    assert again.message.id == d.message.id
    assert again.message.redelivered
    assert again.receipt != d.receipt
    assert (await engine.ack("q", [again.receipt]))["acked"] == 1


async def test_a_length_limit_counts_a_claimed_message_as_in_flight(make_engine) -> None:
    # max_length counts ready messages: a claimed one is in flight, so the next send enters
    # and nothing is dropped from the head.
    engine = await make_engine()
    await engine.declare_queue("q", {"max_length": 1})
    await engine.send({"destination": "q", "body": "a"})
    [held] = await engine.receive("q")
    await engine.send({"destination": "q", "body": "b"})
    [next_one] = await engine.receive("q")
    assert next_one.message.body == b"b"
    acked = await engine.ack("q", [held.receipt, next_one.receipt])
    assert acked == {"acked": 2, "unknown": []}


async def test_a_claim_is_written_within_its_time_without_another_write(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "a"})
    [d] = await engine.receive("q")
    claims = _claims(engine)
    if claims is None:
        return
    assert _row(engine, d.message.id)["state"] == "ready"
    await asyncio.sleep(claims.write_after_s * 2 + 0.2)
    assert len(claims) == 0
    assert _row(engine, d.message.id)["state"] == "delivered"
    assert (await engine.ack("q", [d.receipt]))["acked"] == 1


async def test_stopping_writes_the_claims(make_engine, tmp_path: Path) -> None:
    engine = await make_engine(data_dir=tmp_path / "one")
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "a"})
    [d] = await engine.receive("q")
    await engine.stop()
    reopened = await make_engine(data_dir=tmp_path / "one")
    seen = await reopened.get_message(d.message.id)
    assert (seen.state.value, seen.delivery_count) == ("delivered", 1)
    assert await reopened.receive("q") == []  # still in flight under its receipt
    assert (await reopened.ack("q", [d.receipt]))["acked"] == 1


@pytest.mark.parametrize("how", ["alone", "in a batch"])
async def test_a_rolled_back_write_undoes_its_claims(tmp_path: Path, how: str) -> None:
    db = Database(tmp_path / "q.db", queues_only=True)
    await db.open()
    try:

        def failing(conn: Any) -> None:
            claims = conn.pending_receives
            claims.claim("r1", "q", [1, 2], visible_at_ms=5_000, received_at_ms=1_000)
            raise RuntimeError("the work fails after its claim")

        jobs = [db.write(failing, claims_aware=True)]
        if how == "in a batch":
            jobs.append(db.write(lambda conn: None, claims_aware=True))
        results = await asyncio.gather(*jobs, return_exceptions=True)
        assert isinstance(results[0], RuntimeError)
        claims = db._conn.pending_receives if db._conn is not None else None
        assert claims is not None and len(claims) == 0
        assert claims.claimed_in("q") == set()
    finally:
        await db.close()
