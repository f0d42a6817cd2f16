"""A receive looks before it takes (an empty poll costs a read, not a commit) only when it has
no reason to think the queue holds ready messages: after a release filled it, or a receive
took all it asked for, it takes at once (``Waiters.may_hold``)."""

from __future__ import annotations

from typing import Any

import pytest


async def test_a_filled_queue_is_taken_from_without_a_look_first(make_engine, monkeypatch) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    looks: list[Any] = []
    read = engine.qdb.read

    async def counted(work: Any) -> Any:
        looks.append(work)
        return await read(work)

    monkeypatch.setattr(engine.qdb, "read", counted)
    await engine.send_batch([{"destination": "orders", "body": str(i)} for i in range(3)])
    # Filled by the send's release: taken at once, all that was asked for (it may hold more).
    assert [d.message.body for d in await engine.receive("orders", max_messages=2)] == [b"0", b"1"]
    assert [d.message.body for d in await engine.receive("orders", max_messages=2)] == [b"2"]
    assert looks == []
    # Fewer than asked: the queue is known empty, and the next receive looks (and commits
    # nothing).
    commits = engine.qdb.db.commits if hasattr(engine.qdb, "db") else None
    assert await engine.receive("orders", max_messages=2) == []
    assert len(looks) == 1
    if commits is not None:
        assert engine.qdb.db.commits == commits


@pytest.mark.parametrize("wait_ms", [0, 500])
async def test_a_stale_hint_costs_an_empty_take_and_nothing_is_lost(
    make_engine, wait_ms: int
) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    await engine.send({"destination": "orders", "body": "a"})
    [first] = await engine.receive("orders", max_messages=1)  # all it asked for: may hold more
    assert engine.waiters.may_hold("orders")
    assert await engine.receive("orders", max_messages=1, wait_ms=wait_ms) == []
    assert not engine.waiters.may_hold("orders")
    assert (await engine.ack("orders", [first.receipt]))["acked"] == 1
