"""The engine schedules, releases at the due time (never before), and hands messages to consumers."""

from __future__ import annotations

import asyncio

import pytest
from tests.engine.conftest import BOTH_STORES

from tarry.errors import (
    DestinationFull,
    ExpiryError,
    NotCancellable,
    NotFound,
    PreconditionFailed,
    UnknownDestination,
)
from tarry.model.ids import id_time_ms


@pytest.fixture(params=BOTH_STORES)
def engine_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on the embedded store and on PostgreSQL: the same queue rules."""
    return str(request.param)


async def test_a_delayed_message_is_not_receivable_before_its_due_time(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    result = await engine.send({"destination": "orders", "body": "hi", "delay_ms": 2000})
    assert result.state == "scheduled" and result.deliver_at_ms == clock.now_ms() + 2000
    assert id_time_ms(result.id) == clock.now_ms()

    clock.advance(1999)
    await engine.dispatcher.run_once()
    assert await engine.receive("orders") == []

    clock.advance(1)
    assert await engine.dispatcher.run_once() is True
    [delivery] = await engine.receive("orders")
    assert delivery.message.body == b"hi"
    assert (await engine.get_message(result.id)).state.value == "delivered"
    await engine.ack("orders", [delivery.receipt])
    assert (await engine.get_message(result.id)).state.value == "acked"


async def test_a_message_without_delay_is_ready_at_once(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders", {})
    result = await engine.send({"destination": "orders", "body": "now"})
    assert result.state == "ready"
    assert [d.message.id for d in await engine.receive("orders")] == [result.id]


async def test_sending_to_an_undeclared_destination_is_refused(make_engine) -> None:
    engine = await make_engine()
    with pytest.raises(UnknownDestination):
        await engine.send({"destination": "nowhere", "body": "x"})


async def test_auto_declare_creates_the_queue_on_first_send(make_engine) -> None:
    engine = await make_engine({"server": {"auto_declare": True}})
    await engine.send({"destination": "fresh", "body": "x"})
    assert (await engine.queue_info("fresh")).ready == 1


async def test_a_repeated_message_id_returns_the_first_message_and_stores_nothing(
    make_engine,
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    first = await engine.send({"destination": "q", "body": "a", "message_id": "m1", "delay_ms": 10})
    again = await engine.send({"destination": "q", "body": "b", "message_id": "m1", "delay_ms": 10})
    assert again.id == first.id and again.created is False
    assert (await engine.stats())["messages"]["scheduled"] == 1


async def test_cancel_and_reschedule_work_only_while_scheduled(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    a = await engine.send({"destination": "q", "body": "a", "delay_ms": 1000})
    b = await engine.send({"destination": "q", "body": "b", "delay_ms": 1000, "ttl_ms": 5000})
    await engine.cancel(a.id)
    with pytest.raises(NotCancellable):
        await engine.cancel(a.id)
    with pytest.raises(ExpiryError):
        await engine.reschedule(b.id, {"delay_ms": 6000})
    await engine.reschedule(b.id, {"delay_ms": 3000})
    clock.advance(1000)
    await engine.dispatcher.run_once()
    assert await engine.receive("q") == []
    clock.advance(2000)
    await engine.dispatcher.run_once()
    [d] = await engine.receive("q")
    assert d.message.id == b.id
    with pytest.raises(NotCancellable):
        await engine.cancel(b.id)
    with pytest.raises(NotFound):
        await engine.cancel("01XXXXXXXXXXXXXXXXXXXXXXXX")


async def test_release_into_a_local_queue_happens_once_across_a_crash(
    make_engine, clock, tmp_path, engine_store
) -> None:
    # Given messages claimed by a dispatcher that dies before releasing them
    data = tmp_path / "crash"
    engine = await make_engine(data_dir=data)
    await engine.declare_queue("q", {})
    sent = [
        await engine.send({"destination": "q", "body": str(i), "delay_ms": 10}) for i in range(5)
    ]
    clock.advance(10)
    claimed = await engine.store.fetch_due(clock.now_ms(), limit=10, lease_ms=60_000)
    assert len(claimed) == 5
    await engine.stop()
    # When a new process opens the same data
    engine2 = await make_engine(data_dir=data)
    if engine_store == "postgres":
        # A shared store cannot tell a dead node from a slow one: claims lapse with the lease.
        assert await engine2.dispatcher.run_once() is False
        clock.advance(60_000)
    await engine2.dispatcher.run_once()
    await engine2.dispatcher.run_once()
    # Then each message is in the queue exactly once
    got = await engine2.receive("q", max_messages=100)
    assert sorted(d.message.id for d in got) == sorted(s.id for s in sent)


@pytest.mark.parametrize("engine_store", ["log"])  # the store kept apart from the queues
async def test_a_release_committed_before_its_markers_is_not_repeated_after_a_crash(
    make_engine, clock, tmp_path, engine_store
) -> None:
    """A store apart from the queue database: the process dies after the queue database
    committed a released batch (plain messages and one with headers) and before the store's
    release markers are written. The next process releases nothing twice."""
    data = tmp_path / "crash"
    engine = await make_engine(data_dir=data)
    await engine.declare_queue("q", {})
    sent = [
        await engine.send({"destination": "q", "body": str(i), "delay_ms": 10}) for i in range(4)
    ]
    sent.append(
        await engine.send({"destination": "q", "body": "h", "delay_ms": 10, "headers": {"a": "b"}})
    )
    clock.advance(10)

    class Killed(BaseException):
        """The process dying (not SystemExit: asyncio re-raises that out of the event loop
        when a task, here the dispatcher's release, raises it)."""

    async def dies(*args: object, **kwargs: object) -> int:
        raise Killed("killed between the queue database's commit and the markers")

    engine.store.remove = dies
    with pytest.raises(Killed):
        await engine.dispatcher.run_once()
    await engine.stop()
    engine2 = await make_engine(data_dir=data)
    assert await engine2.dispatcher.run_once() is True  # still due in the store: a no-op
    assert await engine2.dispatcher.run_once() is False  # and the markers are written now
    got = await engine2.receive("q", max_messages=100)
    assert sorted(d.message.id for d in got) == sorted(s.id for s in sent)
    assert len(got) == 5


async def test_redeclaring_a_queue_with_other_arguments_fails(make_engine) -> None:
    engine = await make_engine()
    _, created = await engine.declare_queue("q", {"message_ttl_ms": 1000})
    _, again = await engine.declare_queue("q", {"message_ttl_ms": 1000})
    assert (created, again) == (True, False)
    with pytest.raises(PreconditionFailed):
        await engine.declare_queue("q", {"message_ttl_ms": 2000})


async def test_topic_publish_fans_out_to_the_subscribers_at_send_time(make_engine, clock) -> None:
    engine = await make_engine()
    for q in ("a", "b", "late"):
        await engine.declare_queue(q, {})
    await engine.declare_topic("news")
    await engine.subscribe("news", "a")
    await engine.subscribe("news", "b")
    result = await engine.send({"destination": "news", "body": "extra", "delay_ms": 100})
    await engine.subscribe("news", "late")  # subscribed after the send: gets no copy
    assert sorted(q for _, q in result.copies) == ["a", "b"]
    clock.advance(100)
    await engine.dispatcher.run_once()
    assert len(await engine.receive("a")) == 1
    assert len(await engine.receive("b")) == 1
    assert await engine.receive("late") == []


async def test_a_full_reject_publish_queue_refuses_sends(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("small", {"max_length": 1, "overflow": "reject_publish"})
    await engine.send({"destination": "small", "body": "1"})
    with pytest.raises(DestinationFull):
        await engine.send({"destination": "small", "body": "2"})


async def test_a_batch_accepts_and_rejects_each_item_on_its_own(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    results = await engine.send_batch(
        [
            {"destination": "q", "body": "ok", "delay_ms": 5},
            {"destination": "q", "delay_ms": 5000, "ttl_ms": 10},
            {"destination": "missing"},
        ]
    )
    assert results[0].state == "scheduled"
    assert [getattr(r, "code", None) for r in results[1:]] == [
        "expiry_error",
        "unknown_destination",
    ]


async def test_the_log_store_refuses_a_data_directory_holding_a_sqlite_store(tmp_path) -> None:
    from tarry.config import load_config
    from tarry.engine.core import Engine
    from tarry.errors import InvalidArgument

    # Given a data directory an earlier tarry (SQLite default) wrote
    data = tmp_path / "old"
    data.mkdir()
    (data / "tarry.db").write_bytes(b"")
    config = load_config(None, {"server": {"data_dir": str(data)}, "store": {"engine": "log"}})
    # Then the log store does not start empty beside it, and says what to do
    with pytest.raises(InvalidArgument, match="--store sqlite"):
        Engine.from_config(config)


@pytest.mark.parametrize("engine_store", ["log"])
async def test_a_waiting_consumer_gets_a_released_message_before_its_marker_is_written(
    make_engine, clock, monkeypatch
) -> None:
    """The log store's release marker may wait behind a producer's fsync: the consumer does
    not (the queue database has the message once its transaction commits). Without the
    queues kept in memory, which write no marker for a release."""
    engine = await make_engine({"store": {"queues_in_memory": False}})
    await engine.declare_queue("q", {})
    sent = await engine.send({"destination": "q", "body": "x", "delay_ms": 1000})
    clock.advance(1000)
    markers_may_go = asyncio.Event()
    remove = engine.store.remove

    async def held_remove(*args, **kwargs):
        await markers_may_go.wait()
        return await remove(*args, **kwargs)

    monkeypatch.setattr(engine.store, "remove", held_remove)
    waiting = asyncio.create_task(engine.receive("q", max_messages=10, wait_ms=5000))
    releasing = asyncio.create_task(engine.dispatcher.run_once())
    # Woken by the release, not by the receive's own re-look a second later.
    [delivery] = await asyncio.wait_for(waiting, 0.5)
    assert delivery.message.id == sent.id
    assert not releasing.done()  # the marker is still held back
    markers_may_go.set()
    assert await releasing
    assert await engine.store.count_scheduled() == 0
    assert not await engine.dispatcher.run_once()  # released once: nothing due again


async def test_a_queue_deleted_while_the_list_is_read_is_left_out(make_engine, monkeypatch) -> None:
    from tarry.engine import queue_admin

    engine = await make_engine()
    await engine.declare_queue("a", {})
    await engine.declare_queue("b", {})
    read = queue_admin.queue_info

    async def deleting_b_meanwhile(ctx, name: str):  # as an expiry between two awaits would
        if name == "a":
            await engine.delete_queue("b")
        return await read(ctx, name)

    monkeypatch.setattr(queue_admin, "queue_info", deleting_b_meanwhile)
    names = [q.name for q in await engine.list_queues()]
    assert "a" in names and "b" not in names
