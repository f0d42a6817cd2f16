"""A receive that takes exactly what it asks for may still empty its queue: on SQLite it reads
one row more than it takes, and a queue it emptied has no delivery lag from then on, so sends
are not refused on a sample taken while its consumers were behind."""

from __future__ import annotations

import asyncio

import pytest

from tarry.engine.housekeeping import sample_delivery_lag
from tarry.errors import Overloaded

LIMIT_MS = 300  # sends refused past half of it


async def _sampled_behind(engine, queue: str) -> None:
    """Run the engine's sampler until it finds ``queue`` behind."""
    sampler = asyncio.create_task(sample_delivery_lag(engine.ctx))
    try:
        for _ in range(100):
            if engine.waiters.lag.lag_ms(queue) > LIMIT_MS // 2:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the sampler never found {queue} behind")
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)


async def _behind_with_ready(make_engine, clock, ready: int):
    """An engine whose queue ``q`` has ``ready`` messages waiting a second past their due
    time, behind as last sampled, after its consumer took 5."""
    engine = await make_engine({"dispatch": {"overload_lag_ms": LIMIT_MS}})
    await engine.declare_queue("q", {})
    for i in range(5 + ready):
        await engine.send({"destination": "q", "body": str(i)})
    assert len(await engine.receive("q", max_messages=5)) == 5
    clock.advance(1_000)
    await _sampled_behind(engine, "q")
    with pytest.raises(Overloaded):
        await engine.send({"destination": "q", "body": "refused"})
    return engine


async def test_a_receive_that_took_all_there_was_lets_sends_in_at_once(make_engine, clock) -> None:
    # Given a queue behind as last sampled, 15 messages ready
    engine = await _behind_with_ready(make_engine, clock, 15)
    # When its consumer takes exactly the 15 it asks for
    taken = await engine.receive("q", max_messages=15)
    assert len(taken) == 15
    assert engine.waiters.lag.lag_ms("q") == 0
    # Then the next send is taken, before any new sample (and counts only for itself)
    sent = await engine.send({"destination": "q", "body": "after"})
    assert sent.id
    assert engine.waiters.lag.lag_ms("q") < LIMIT_MS // 2


async def test_a_receive_that_left_some_keeps_the_lag_as_sampled(make_engine, clock) -> None:
    # Given the same, with 16 ready
    engine = await _behind_with_ready(make_engine, clock, 16)
    # When its consumer takes 15, leaving one
    assert len(await engine.receive("q", max_messages=15)) == 15
    # Then sends stay refused until a sample says otherwise, and the one left is taken next
    with pytest.raises(Overloaded):
        await engine.send({"destination": "q", "body": "refused"})
    assert len(await engine.receive("q", max_messages=15)) == 1
    assert engine.waiters.lag.lag_ms("q") == 0


async def test_rows_an_earlier_receive_holds_are_not_counted_as_left(make_engine, clock) -> None:
    # Given 10 messages, 5 of them taken and not acked (on the log store's queue database, a
    # claim kept in memory: the rows are still ready in the table)
    engine = await make_engine()
    await engine.declare_queue("q", {})
    for i in range(10):
        await engine.send({"destination": "q", "body": str(i)})
    held = await engine.receive("q", max_messages=5)
    # When a second receive takes the other 5, asking for 5
    rest = await engine.receive("q", max_messages=5)
    # Then it took all there was: the rows the first holds are not left for it
    assert {d.message.id for d in rest}.isdisjoint(d.message.id for d in held)
    assert len(rest) == 5 and not rest.taken.more
