"""A receive given receipts to ack (``ack``) acks them first, in the transaction of its first
look, then takes: a consumer's ack and its next receive in one request and one commit."""

from __future__ import annotations

import asyncio

import pytest
from tests.engine.conftest import BOTH_STORES

from tarry.errors import InvalidArgument, NotFound


@pytest.fixture(params=BOTH_STORES)
def engine_store(request: pytest.FixtureRequest) -> str:
    """The log store's queue database keeps receives' claims in memory until an ack writes
    them; SQLite and PostgreSQL write each receive at once: the same answers on each."""
    return str(request.param)


async def _state(engine, message_id: str) -> str:
    return str((await engine.get_message(message_id)).state.value)


async def _one_received(make_engine, **receive: int):
    """An engine whose queue ``q`` held one message, now received: (engine, sent, taken)."""
    engine = await make_engine()
    await engine.declare_queue("q", {})
    sent = await engine.send({"destination": "q", "body": "x"})
    [taken] = await engine.receive("q", **receive)
    return engine, sent, taken


async def test_a_receive_acks_the_last_batch_then_takes_the_next(make_engine) -> None:
    # Given four messages, two of them received
    engine = await make_engine()
    await engine.declare_queue("q", {})
    sent = [(await engine.send({"destination": "q", "body": str(i)})).id for i in range(4)]
    first = await engine.receive("q", max_messages=2)
    # When the next receive carries their receipts
    second = await engine.receive("q", max_messages=10, ack=[d.receipt for d in first])
    # Then those two are acked, and it takes the other two (never the acked ones)
    assert second.settled == {"acked": 2, "unknown": []}
    assert [d.message.id for d in second] == sent[2:]
    assert [await _state(engine, i) for i in sent] == ["acked", "acked", "delivered", "delivered"]
    info = await engine.queue_info("q")
    assert (info.ready, info.in_flight) == (0, 2)


async def test_receipts_it_cannot_ack_are_unknown_as_an_ack_answers(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.declare_queue("other", {})
    for i in range(2):
        await engine.send({"destination": "q", "body": str(i)})
    await engine.send({"destination": "other", "body": "o"})
    mine = [d.receipt for d in await engine.receive("q", max_messages=10)]
    [theirs] = await engine.receive("other")
    # Each receipt twice, another queue's, and one never made
    asked = [*mine, mine[0], theirs.receipt, "nope"]
    got = await engine.receive("q", ack=asked)
    assert got.settled == {"acked": 2, "unknown": [mine[0], theirs.receipt, "nope"]}
    assert list(got) == []
    assert (await engine.queue_info("other")).in_flight == 1


async def test_the_ack_is_written_before_a_long_poll_waits(make_engine) -> None:
    # Given a message received, and an empty queue behind it
    engine, done, taken = await _one_received(make_engine)
    # When a long-poll carries its receipt
    waiting = asyncio.create_task(engine.receive("q", wait_ms=5000, ack=[taken.receipt]))
    await asyncio.sleep(0.05)
    # Then it is acked while the poll still waits, and the poll answers the ack with what comes
    assert not waiting.done()
    assert await _state(engine, done.id) == "acked"
    later = await engine.send({"destination": "q", "body": "later"})
    got = await asyncio.wait_for(waiting, 5)
    assert [d.message.id for d in got] == [later.id]
    assert got.settled == {"acked": 1, "unknown": []}


async def test_a_long_poll_that_finds_nothing_still_answers_its_ack(make_engine) -> None:
    engine, sent, taken = await _one_received(make_engine)
    got = await engine.receive("q", wait_ms=100, ack=[taken.receipt])
    assert (list(got), got.settled) == ([], {"acked": 1, "unknown": []})
    assert await _state(engine, sent.id) == "acked"


async def test_without_ack_the_answer_has_no_settled_and_an_empty_ack_acks_nothing(
    make_engine,
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "x"})
    assert (await engine.receive("q", max_messages=1)).settled is None
    got = await engine.receive("q", ack=[])
    assert got.settled == {"acked": 0, "unknown": []}


async def test_a_refused_receive_acks_nothing(make_engine) -> None:
    # Given a message received
    engine, sent, taken = await _one_received(make_engine)
    # When a receive carrying its receipt is refused (bad receipts, a bad max, no such queue)
    with pytest.raises(InvalidArgument, match="ack must be a list of receipt strings"):
        await engine.receive("q", ack=taken.receipt)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="max"):
        await engine.receive("q", max_messages=0, ack=[taken.receipt])
    with pytest.raises(NotFound):
        await engine.receive("nowhere", ack=[taken.receipt])
    # Then it is still in flight, and a plain ack settles it
    assert await _state(engine, sent.id) == "delivered"
    assert await engine.ack("q", [taken.receipt]) == {"acked": 1, "unknown": []}


async def test_a_message_back_from_its_visibility_timeout_is_acked_not_taken_again(
    make_engine, clock
) -> None:
    # Given a message whose visibility timeout ran out before its consumer acked it
    engine, sent, taken = await _one_received(make_engine, visibility_ms=1000)
    clock.advance(1000)
    # When the consumer's next receive carries its receipt
    got = await engine.receive("q", max_messages=10, ack=[taken.receipt])
    # Then the ack comes first, as an ack on its own would have: acked, not delivered twice
    assert (list(got), got.settled) == ([], {"acked": 1, "unknown": []})
    assert await _state(engine, sent.id) == "acked"
