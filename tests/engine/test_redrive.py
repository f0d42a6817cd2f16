"""Redrive: dead letters go back to where they came from, each exactly once, on every store."""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine.conftest import BOTH_STORES

from tarry.errors import InvalidArgument, NotFound, Unavailable, UnknownDestination
from tarry.model.redrive import RedriveCursor
from tarry.store.log.record import encode_message
from tarry.transports.memory import MemoryTransport


@pytest.fixture(params=BOTH_STORES)
def engine_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on the log store, SQLite and PostgreSQL."""
    return str(request.param)


async def _dead_letters(engine: Any, count: int, *, queue: str = "orders") -> list[str]:
    """``count`` messages sent to ``queue`` and rejected by a consumer: dead letters in
    ``queue.dead``; returns the ids they had in ``queue``."""
    if queue not in engine.catalog.queues:
        await engine.declare_queue(f"{queue}.dead", {})
        await engine.declare_queue(queue, {"dead_letter_to": f"{queue}.dead"})
    ids = []
    for i in range(count):
        ids.append((await engine.send({"destination": queue, "body": f"m{i}"})).id)
    taken = await engine.receive(queue, max_messages=count)
    await engine.nack(queue, [d.receipt for d in taken], requeue=False)
    return ids


async def _ready(engine: Any, queue: str, *, ack: bool = True) -> list[Any]:
    """What a consumer of ``queue`` takes now (acked, or back in 1 ms with ``ack=False``)."""
    taken = await engine.receive(queue, max_messages=1000, visibility_ms=1)
    if ack and taken:
        await engine.ack(queue, [d.receipt for d in taken])
    return [d.message for d in taken]


async def test_rejected_dead_letters_go_back_to_their_queue_once_keeping_their_deaths(
    make_engine, clock
) -> None:
    # Given three messages rejected into orders.dead
    engine = await make_engine()
    originals = await _dead_letters(engine, 3)
    dead_ids = [m.id for m in await _ready(engine, "orders.dead", ack=False)]
    clock.advance(1)  # their visibility ends: ready in orders.dead again
    # When the dead-letter queue is redriven, twice
    first = await engine.redrive("orders.dead", {})
    second = await engine.redrive("orders.dead", {})
    # Then each is back in orders once, a new message linked to its dead letter, deaths kept
    assert first == {"moved": 3, "skipped": 0, "skipped_reasons": {}, "next_cursor": None}
    assert second["moved"] == 0
    back = await _ready(engine, "orders")
    assert sorted(m.body for m in back) == [b"m0", b"m1", b"m2"]
    assert {m.headers["tarry-redriven-from"] for m in back} == set(dead_ids)
    assert not {m.id for m in back} & (set(dead_ids) | set(originals))
    assert all([d.reason.value for d in m.deaths] == ["rejected"] for m in back)
    assert {m.headers["tarry-original-id"] for m in back} == set(originals)
    # And each dead letter is finished, naming what it became
    for dead_id in dead_ids:
        dead = await engine.get_message(dead_id)
        assert dead.state.value == "acked"
        assert dead.headers["tarry-redriven-to"] in {m.id for m in back}
    assert await _ready(engine, "orders.dead") == []
    assert ("redriven", dead_ids[0]) in [(e, i) for e, i, _, _ in engine.recorder.events]


async def test_filters_pick_dead_letters_by_origin_and_reason_and_ids_say_why_they_stay(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("dlq", {})
    await engine.declare_queue("a", {"dead_letter_to": "dlq", "message_ttl_ms": 1000})
    await engine.declare_queue("b", {"dead_letter_to": "dlq"})
    await engine.send({"destination": "a", "body": "a-expired"})
    clock.advance(1000)
    await engine.sweep()
    await _dead_letters(engine, 1, queue="b")
    # dlq now holds an expired one from a and a rejected one from b
    assert await engine.redrive("dlq", {"reason": "rejected", "original_destination": "a"}) == {
        "moved": 0,
        "skipped": 0,
        "skipped_reasons": {},
        "next_cursor": None,
    }
    assert (await engine.redrive("dlq", {"original_destination": "b"}))["moved"] == 1
    assert [m.body for m in await _ready(engine, "b")] == [b"m0"]
    [left] = await _ready(engine, "dlq", ack=False)
    clock.advance(1)
    answer = await engine.redrive("dlq", {"ids": [left.id, "01NOSUCHID", left.id], "to": "b"})
    assert answer["moved"] == 1 and answer["skipped_reasons"] == {"not_found": 1}
    [moved] = await _ready(engine, "b")
    assert moved.body == b"a-expired" and moved.deaths[0].reason.value == "expired"


async def test_a_delayed_redrive_is_scheduled_and_released_at_its_time(make_engine, clock) -> None:
    engine = await make_engine()
    await _dead_letters(engine, 2)
    answer = await engine.redrive("orders.dead", {"delay_ms": 5000})
    assert answer["moved"] == 2
    listed, _ = await engine.list_messages(_query(destination="orders", state="scheduled"))
    assert len(listed) == 2 and all(m.deaths for m in listed)
    clock.advance(4999)
    await engine.dispatcher.run_once()
    assert await _ready(engine, "orders") == []
    clock.advance(1)
    await engine.dispatcher.run_once()
    back = await _ready(engine, "orders")
    assert sorted(m.body for m in back) == [b"m0", b"m1"]
    assert all(m.deaths[0].reason.value == "rejected" for m in back)


async def test_undeliverable_messages_go_back_from_the_error_queue_to_their_route(
    make_engine, clock
) -> None:
    engine = await make_engine()
    hook = MemoryTransport()
    engine.transports["hook"] = hook
    hook.fail_next(1)
    failed = await engine.send({"destination": "hook", "body": "ping"})
    await engine.dispatcher.run_once()
    await engine.dispatcher.drain()
    assert (await engine.get_message(failed.id)).state.value == "dead_lettered"
    answer = await engine.redrive("tarry.error", {"reason": "delivery_failed"})
    assert answer["moved"] == 1
    await engine.dispatcher.run_once()
    await engine.dispatcher.drain()
    [delivered] = hook.delivered
    assert delivered.body == b"ping" and delivered.id != failed.id
    assert delivered.deaths[0].destination == "hook"


async def test_max_and_the_cursor_page_a_large_redrive_without_moving_anything_twice(
    make_engine, clock
) -> None:
    # Given 7 dead letters whose queue rejects them again on arrival (max_length 0)
    engine = await make_engine()
    await engine.declare_queue("back.dead", {})
    await engine.declare_queue("back", {"dead_letter_to": "back.dead"})
    await _dead_letters(engine, 7, queue="back")
    await engine.delete_queue("back")
    await engine.declare_queue("back", {"dead_letter_to": "back.dead", "max_length": 0})
    clock.advance(1)
    moved, cursor, pages = 0, None, 0
    while True:
        page = {"max": 3} | ({"cursor": cursor} if cursor else {})
        answer = await engine.redrive("back.dead", page)
        moved, cursor, pages = moved + answer["moved"], answer["next_cursor"], pages + 1
        if cursor is None:
            break
    # Then the 7 moved once each; their second deaths wait in back.dead for a later redrive
    assert moved == 7 and pages == 3
    again = await _ready(engine, "back.dead")
    assert len(again) == 7
    assert all(m.deaths[0].reason.value == "maxlen" for m in again)


async def test_bad_requests_are_refused_with_what_to_fix(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    with pytest.raises(NotFound):
        await engine.redrive("nowhere", {})
    with pytest.raises(UnknownDestination):
        await engine.redrive("q", {"to": "nowhere"})
    for body in (
        {"max": 0},
        {"reason": "tired"},
        {"ids": []},
        {"cursor": "!!"},
        {"delay_ms": -1},
        {"colour": "red"},
    ):
        with pytest.raises(InvalidArgument):
            await engine.redrive("q", body)
    with pytest.raises(InvalidArgument):
        await engine.redrive("q", {"ids": ["x"], "cursor": RedriveCursor(0, 1).encode()})


@pytest.mark.parametrize("engine_store", ["memory"])
async def test_a_store_that_fails_after_the_move_keeps_the_messages_on_resume(
    make_engine, clock
) -> None:
    # Given a redrive whose delayed store refuses to write after the queue database committed
    engine = await make_engine()
    await _dead_letters(engine, 2)
    engine.store.fail_next(1)
    with pytest.raises(Unavailable):
        await engine.redrive("orders.dead", {"delay_ms": 1000})
    assert await _ready(engine, "orders.dead") == []  # moved out: they wait in the outbox
    # When the next redrive (or a restart) resumes
    assert (await engine.redrive("orders.dead", {}))["moved"] == 0
    clock.advance(1000)
    await engine.dispatcher.run_once()
    # Then both arrive, once each
    assert sorted(m.body for m in await _ready(engine, "orders")) == [b"m0", b"m1"]


@pytest.mark.parametrize("engine_store", ["log"])
async def test_resuming_an_outbox_already_kept_by_the_store_stores_nothing_twice(
    make_engine, clock
) -> None:
    # Given a delayed redrive done, whose outbox rows a crash kept (as if before their delete)
    engine = await make_engine()
    await _dead_letters(engine, 3)
    await engine.redrive("orders.dead", {"delay_ms": 1000})
    kept, _ = await engine.list_messages(_query(destination="orders", state="scheduled"))
    await engine.qdb.write(
        lambda conn: conn.executemany(
            "INSERT INTO redrive_outbox (id, record) VALUES (?, ?)",
            [(m.id, encode_message(m)) for m in kept],
        )
    )
    # When the engine resumes
    await engine.redriver.open()
    # Then the store holds each once
    clock.advance(1000)
    await engine.dispatcher.run_once()
    assert sorted(m.body for m in await _ready(engine, "orders")) == [b"m0", b"m1", b"m2"]
    rows = await engine.qdb.read(
        lambda conn: conn.execute("SELECT count(*) FROM redrive_outbox").fetchone()
    )
    assert rows[0] == 0


@pytest.mark.parametrize("engine_store", [pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_on_postgres_at_least_once_a_delayed_redrive_goes_through_the_outbox(
    make_engine, clock
) -> None:
    # Each node keeps its queues in its own SQLite file; the delayed store is PostgreSQL.
    engine = await make_engine({"store": {"consistency": "at_least_once"}})
    assert not engine.shared
    await _dead_letters(engine, 3)
    assert (await engine.redrive("orders.dead", {"delay_ms": 1000}))["moved"] == 3
    assert await engine.store.count_scheduled("orders") == 3
    clock.advance(1000)
    await engine.dispatcher.run_once()
    back = await _ready(engine, "orders")
    assert sorted(m.body for m in back) == [b"m0", b"m1", b"m2"]
    assert all(m.deaths and m.headers["tarry-redriven-from"] for m in back)


def _query(**filters: Any) -> Any:
    from tarry.engine.types import MessageQuery

    return MessageQuery(**filters)
