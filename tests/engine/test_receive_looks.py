"""A receive looks before it takes (an empty poll costs a read, not a commit) only when it has
no reason to think the queue holds ready messages: after a release filled it, or a receive
took all it asked for and left more, it takes at once (``Waiters.may_hold``)."""

from __future__ import annotations

from typing import Any

import pytest


async def test_a_filled_queue_is_taken_from_without_a_look_first(make_engine, monkeypatch) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    looks: list[Any] = []
    # The database itself (in front of it, the queues kept in memory: ``memory_queues``).
    database = engine.ctx.queue_db
    read = database.read

    async def counted(work: Any) -> Any:
        looks.append(work)
        return await read(work)

    monkeypatch.setattr(database, "read", counted)
    await engine.send_batch([{"destination": "orders", "body": str(i)} for i in range(3)])
    # Filled by the send's release: taken at once, all that was asked for (it may hold more).
    first = await engine.receive("orders", max_messages=2)
    assert [d.message.body for d in first] == [b"0", b"1"]
    second = await engine.receive("orders", max_messages=2)
    assert [d.message.body for d in second] == [b"2"]
    assert looks == []
    # Acked, so no receive's claim waits to be written (``pending_receives``).
    await engine.ack("orders", [d.receipt for d in [*first, *second]])
    # Fewer than asked: the queue is known empty, and the next receive looks (and commits
    # nothing).
    commits = engine.qdb.db.commits if hasattr(engine.qdb, "db") else None
    assert await engine.receive("orders", max_messages=2) == []
    assert len(looks) == 1
    if commits is not None:
        assert engine.qdb.db.commits == commits


async def test_a_look_writes_the_claims_of_receives_not_yet_acked_once(make_engine) -> None:
    # A receive kept its rows as a claim: the look (a read) has it written first, once.
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    await engine.send({"destination": "orders", "body": "a"})
    [held] = await engine.receive("orders", max_messages=2)
    database = getattr(engine.qdb, "db", None)
    claims = None if database is None else database._conn.pending_receives
    commits = None if database is None else database.commits
    assert await engine.receive("orders", max_messages=2) == []
    if claims is not None and commits is not None:
        assert len(claims) == 0
        assert database.commits == commits + 1
        assert await engine.receive("orders", max_messages=2) == []
        assert database.commits == commits + 1
    assert (await engine.ack("orders", [held.receipt]))["acked"] == 1


@pytest.mark.parametrize("wait_ms", [0, 500])
async def test_a_stale_hint_costs_an_empty_take_and_nothing_is_lost(
    make_engine, wait_ms: int
) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    await engine.send({"destination": "orders", "body": "a"})
    [first] = await engine.receive("orders", max_messages=1)  # all there was: nothing left
    assert not engine.waiters.may_hold("orders")
    # A release's hint whose messages are gone before the next receive (taken, expired)
    engine.waiters.wake({"orders"})
    assert engine.waiters.may_hold("orders")
    assert await engine.receive("orders", max_messages=1, wait_ms=wait_ms) == []
    assert not engine.waiters.may_hold("orders")
    assert (await engine.ack("orders", [first.receipt]))["acked"] == 1
