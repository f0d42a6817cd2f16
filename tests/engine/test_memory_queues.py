"""Local queues kept in memory (``tarry.engine.memory_queues``), on the log store: a plain
release, receive and ack commit nothing in the queue database; everything else sees the rows
written out first; a message is never released twice, across a restart included."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tarry.engine import memory_queues
from tarry.model.batch import COLUMN_MIN
from tarry.model.state import MessageState
from tarry.queues.lag import read_head
from tarry.server.metrics import Metrics


@pytest.fixture
def engine_store() -> str:
    return "log"


async def _released(engine: Any, clock: Any, queue: str, count: int) -> list[str]:
    """``count`` plain messages for ``queue``, due in 1 s, then released (into memory)."""
    await engine.declare_queue(queue, {})
    results = await engine.send_batch(
        [{"destination": queue, "body": f"m{i}", "delay_ms": 1000} for i in range(count)]
    )
    clock.advance(1000)
    assert await engine.dispatcher.run_once()
    assert engine.memory.ready_in(queue) == count
    return [r.id for r in results]


async def test_a_release_receive_and_ack_commit_nothing_in_the_queue_database(
    make_engine, clock
) -> None:
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 3)
    database = engine.qdb.db
    commits = database.commits
    taken = await engine.receive("q", max_messages=10)
    assert [d.message.id for d in taken] == ids
    assert all("." not in d.receipt for d in taken)
    assert await engine.ack("q", [d.receipt for d in taken]) == {"acked": 3, "unknown": []}
    assert database.commits == commits
    # The acks' markers are written: the store holds nothing, nothing falls due again.
    assert await engine.store.count_scheduled() == 0
    clock.advance(60_000)
    assert not await engine.dispatcher.run_once()
    # Every message told released, received and acked once.
    for event in ("released", "received", "acked"):
        assert sorted(e[1] for e in engine.recorder.of(event)) == sorted(ids)
    # Read through the barrier: the finished rows are written out first.
    assert {(await engine.get_message(i)).state for i in ids} == {MessageState.ACKED}
    assert len(engine.memory.memory) == 0


async def test_counts_and_lists_see_the_rows_held_in_memory(make_engine, clock) -> None:
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 4)
    [first] = await engine.receive("q", max_messages=1)
    info = await engine.queue_info("q")
    assert (info.ready, info.in_flight) == (3, 1)
    # Counted where they are (the console polls this), nothing written out: the rest is
    # received from memory, in order, each once.
    assert engine.memory.sizes() == {"ready": 3, "in_flight": 1, "acked": 0}
    rest = await engine.receive("q", max_messages=10)
    assert all("." not in d.receipt for d in rest)
    assert [d.message.id for d in rest] == ids[1:]
    assert await engine.ack("q", [first.receipt, *(d.receipt for d in rest)]) == {
        "acked": 4,
        "unknown": [],
    }
    clock.advance(60_000)
    assert await engine.receive("q", max_messages=10) == []
    assert not await engine.dispatcher.run_once()


async def test_a_nack_of_a_row_held_in_memory_requeues_it(make_engine, clock) -> None:
    engine = await make_engine()
    [sent] = await _released(engine, clock, "q", 1)
    [held] = await engine.receive("q", max_messages=1)
    assert await engine.nack("q", [held.receipt], requeue=True) == {"nacked": 1, "unknown": []}
    [again] = await engine.receive("q", max_messages=1)
    assert again.message.id == sent
    assert again.message.redelivered
    assert (await engine.ack("q", [again.receipt]))["acked"] == 1
    assert (await engine.ack("q", [held.receipt]))["unknown"] == [held.receipt]


async def test_a_visibility_timeout_of_a_row_written_out_in_flight_ends_there(
    make_engine, clock
) -> None:
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 2)
    [held] = await engine.receive("q", max_messages=1, visibility_ms=5_000)
    await engine.memory.write_out_all()  # as the write-out every 0.2 s does
    [second] = await engine.receive("q", max_messages=1)
    assert second.message.id == ids[1]
    assert await engine.receive("q", max_messages=1) == []
    clock.advance(5_000)
    [again] = await engine.receive("q", max_messages=1)
    assert again.message.id == ids[0]
    assert again.receipt != held.receipt
    assert (await engine.ack("q", [held.receipt]))["unknown"] == [held.receipt]
    assert (await engine.ack("q", [again.receipt, second.receipt]))["acked"] == 2


async def test_a_queue_with_a_ttl_and_keyed_messages_take_the_database_path(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("ttl", {"message_ttl_ms": 60_000})
    await engine.declare_queue("keyed", {})
    await engine.send({"destination": "ttl", "body": "a", "delay_ms": 1000})
    await engine.send({"destination": "keyed", "body": "b", "delay_ms": 1000, "message_id": "k"})
    clock.advance(1000)
    assert await engine.dispatcher.run_once()
    assert len(engine.memory.memory) == 0
    assert len(await engine.receive("ttl", max_messages=5)) == 1
    assert len(await engine.receive("keyed", max_messages=5)) == 1


async def test_rows_held_at_a_stop_are_written_out_and_received_once_after(
    make_engine, clock, tmp_path
) -> None:
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 3)
    [acked] = await engine.receive("q", max_messages=1)
    await engine.ack("q", [acked.receipt])
    await engine.stop()
    again = await make_engine(data_dir=tmp_path / "data")
    clock.advance(60_000)
    assert not await again.dispatcher.run_once()
    rest = await again.receive("q", max_messages=10)
    assert [d.message.id for d in rest] == ids[1:]
    assert (await again.get_message(ids[0])).state is MessageState.ACKED


async def test_a_release_whose_marker_a_crash_lost_is_not_released_again_into_memory(
    make_engine, clock, tmp_path, monkeypatch
) -> None:
    """Released through the queue database before a crash that came ahead of its marker: due
    again at the next start, before which it fell due, so it takes the database's path and its
    row there stands; it is received once."""
    engine = await make_engine({"store": {"queues_in_memory": False}})
    await engine.declare_queue("q", {})
    sent = await engine.send({"destination": "q", "body": "x", "delay_ms": 1000})
    clock.advance(1000)

    async def no_marker(*args: Any, **kwargs: Any) -> int:
        return 0

    monkeypatch.setattr(engine.store, "remove", no_marker)
    assert await engine.dispatcher.run_once()
    await engine.stop()
    clock.advance(1000)
    again = await make_engine(data_dir=tmp_path / "data")
    assert again.memory is not None
    assert await again.dispatcher.run_once()  # due again: its release finds its row
    assert len(again.memory.memory) == 0
    [once] = await again.receive("q", max_messages=10)
    assert once.message.id == sent.id
    assert await again.receive("q", max_messages=10) == []
    await again.ack("q", [once.receipt])
    assert not await again.dispatcher.run_once()


async def test_a_message_sent_without_a_delay_is_released_once_when_the_dispatcher_meets_it(
    make_engine, clock, monkeypatch
) -> None:
    """Its send releases it through the queue database; should the dispatcher fetch it before
    that release's marker is written, its release takes the same path (a no-op there), never
    the memory's."""
    import asyncio

    engine = await make_engine()
    await engine.declare_queue("q", {})
    clock.advance(1000)  # sent after the start (else it is never the memory's anyway)
    markers_may_go, committed = asyncio.Event(), asyncio.Event()
    remove = engine.store.remove

    async def held_remove(*args: Any, **kwargs: Any) -> int:
        committed.set()  # the send's release is in the queue database
        await markers_may_go.wait()
        return await remove(*args, **kwargs)

    monkeypatch.setattr(engine.store, "remove", held_remove)
    sending = asyncio.create_task(engine.send({"destination": "q", "body": "now"}))
    await asyncio.wait_for(committed.wait(), 5)
    releasing = asyncio.create_task(engine.dispatcher.run_once())
    await asyncio.sleep(0.05)
    assert len(engine.memory.memory) == 0
    markers_may_go.set()
    sent = await sending
    await releasing
    [once] = await engine.receive("q", max_messages=10)
    assert once.message.id == sent.id
    assert await engine.receive("q", max_messages=10) == []


async def test_rows_written_out_are_the_rows_the_database_path_writes(make_engine, clock) -> None:
    """An acked row, a row in flight and a ready row of the memory read back from the queue
    database as the same messages received and acked through the database read back."""
    from tarry.store.sqlite.rows import COLUMNS, SELECT_SQL

    engine = await make_engine()
    await engine.declare_queue("q", {})
    clock.advance(1000)
    plain = {"destination": "q", "correlation_id": "c"}
    kept = [await engine.send({**plain, "body": f"k{i}", "delay_ms": 1000}) for i in range(3)]
    clock.advance(1000)
    assert await engine.dispatcher.run_once()
    assert engine.memory.memory.ready_in("q") == 3
    [acked_here, held_here] = await engine.receive("q", max_messages=2)
    await engine.ack("q", [acked_here.receipt])
    # The same through the database: sent without a delay, released by the send.
    direct = [await engine.send({**plain, "body": f"d{i}"}) for i in range(3)]
    await engine.memory.write_out_all()
    ready = await engine.qdb.read(lambda conn: conn.execute(SELECT_SQL).fetchall())
    taken = await engine.receive("q", max_messages=3)
    assert [d.message.id for d in taken] == [kept[2].id, direct[0].id, direct[1].id]
    await engine.ack("q", [taken[1].receipt])
    later = await engine.qdb.read(lambda conn: conn.execute(SELECT_SQL).fetchall())
    ignored = {"id", "body", "seq", "sent_at_ms", "deliver_at_ms", "enqueued_at_ms"}
    ignored |= {"visible_at_ms", "updated_at_ms", "receipt"}

    def shape(rows: list[Any], message_id: str) -> dict[str, Any]:
        [row] = [r for r in rows if r[0] == message_id]
        return {c: v for c, v in zip(COLUMNS, row, strict=True) if c not in ignored}

    # ready, acked and in flight: each as the database's own
    assert shape(ready, kept[2].id) == shape(ready, direct[2].id)
    assert shape(later, kept[0].id) == shape(later, direct[0].id)
    assert shape(later, held_here.message.id) == shape(later, direct[1].id)
    assert shape(later, kept[0].id)["state"] == "acked"
    assert shape(later, held_here.message.id)["state"] == "delivered"


async def test_a_write_out_whose_caller_is_cancelled_still_moves_each_row_once(
    make_engine, clock
) -> None:
    """A read whose client went away while the rows held in memory were written out first:
    the transaction commits all the same, so the rows must not go back into memory."""
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 3)
    reading = asyncio.create_task(engine.queue_info("q"))
    await asyncio.sleep(0)  # inside the write-out's transaction
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    await asyncio.sleep(0.1)
    taken = await engine.receive("q", max_messages=10)
    assert sorted(d.message.id for d in taken) == sorted(ids)
    assert await engine.receive("q", max_messages=10) == []


async def test_the_lag_sampler_counts_rows_held_in_memory_up_to_its_cap(make_engine, clock) -> None:
    # Given 2 ready rows written out to the queue database, and 5 after them held in memory
    engine = await make_engine()
    first, _ = await _released(engine, clock, "q", 2)
    await engine.memory.write_out_all()
    await _released(engine, clock, "q", 5)
    # When the sampler reads the database's head (without the barrier) and adds memory's
    head = await engine.memory.database.read(lambda conn: read_head(conn, "q", 100))
    assert head.ready == 2
    counted, capped, uncounted = (engine.memory.with_head("q", head, cap) for cap in (100, 4, 0))
    # Then its head is the oldest of both, and its count both up to the cap (0: none counted)
    first_due = (await engine.get_message(first)).deliver_at_ms
    assert counted.oldest_due_ms == capped.oldest_due_ms == first_due
    assert (counted.ready, capped.ready, uncounted.ready) == (7, 4, 0)


async def test_health_and_metrics_count_the_rows_held_in_memory_by_kind(make_engine, clock) -> None:
    # Given 4 rows released into memory, 2 received and 1 of those acked
    engine = await make_engine()
    await _released(engine, clock, "q", 4)
    first, _ = await engine.receive("q", max_messages=2)
    await engine.ack("q", [first.receipt])
    held = {"ready": 2, "in_flight": 1, "acked": 1}
    # And one more sent, still scheduled
    await engine.send({"destination": "q", "body": "later", "delay_ms": 60_000})
    # Then /healthz counts them by kind, and so does /metrics
    assert engine.health()["queue_rows_in_memory"] == held
    text = (await Metrics().render(engine))[0].decode()
    for kind, rows in held.items():
        assert f'tarry_queue_rows_in_memory{{kind="{kind}"}} {float(rows)}' in text
    # And the counts by state count each message once, where it is, writing nothing out (a
    # scrape must not send every row held down the queue database's path)
    by_state = {"scheduled": 1, "ready": 2, "delivered": 1, "acked": 1}
    for state, count in by_state.items():
        assert f'tarry_messages_by_state{{state="{state}"}} {float(count)}' in text
    assert (await engine.stats())["messages"] == {**dict.fromkeys(MessageState, 0), **by_state}
    assert engine.health()["queue_rows_in_memory"] == held
    # The same while they are being written out (each row is counted in one place), and after
    counted = [(await engine.stats())["messages"] for _ in range(2)]
    _, during = await asyncio.gather(engine.memory.write_out_all(), engine.stats())
    counted += [during["messages"], (await engine.stats())["messages"]]
    assert counted == [{**dict.fromkeys(MessageState, 0), **by_state}] * 4


async def _until(condition: Any, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_ready_rows_wait_in_memory_longer_than_rows_in_flight(
    make_engine, clock, monkeypatch
) -> None:
    # Given ready rows kept 1 s for a receive, rows in flight 0.1 s
    monkeypatch.setattr(memory_queues, "READY_WRITE_AFTER_S", 1.0)
    monkeypatch.setattr(memory_queues, "WRITE_AFTER_S", 0.1)
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 3)
    [held] = await engine.receive("q", max_messages=1)
    # When the row in flight is written out, the ready ones are still in memory
    await _until(lambda: engine.memory.sizes()["in_flight"] == 0)
    assert engine.memory.sizes()["ready"] == 2
    # Then they go once nobody took them for a second, and each is received once, in order
    await _until(lambda: engine.memory.sizes()["ready"] == 0)
    # (out of memory before their transaction commits: a long-poll is woken by the commit)
    taken = await engine.receive("q", max_messages=10, wait_ms=2_000)
    assert [d.message.id for d in taken] == ids[1:]
    assert (await engine.ack("q", [held.receipt]))["acked"] == 1


async def test_past_max_ready_rows_every_ready_row_is_written_out(
    make_engine, clock, monkeypatch
) -> None:
    monkeypatch.setattr(memory_queues, "READY_WRITE_AFTER_S", 60.0)
    monkeypatch.setattr(memory_queues, "MAX_READY_ROWS", 2)
    engine = await make_engine()
    ids = await _released(engine, clock, "q", 3)
    await _until(lambda: engine.memory.sizes()["ready"] == 0, timeout_s=1.0)
    taken = await engine.receive("q", max_messages=10, wait_ms=2_000)  # woken by the commit
    assert [d.message.id for d in taken] == ids


async def test_a_receive_too_short_for_memory_writes_out_its_own_queue_only(
    make_engine, clock
) -> None:
    # Given rows held in memory for two queues
    engine = await make_engine()
    in_a = await _released(engine, clock, "a", 3)
    in_b = await _released(engine, clock, "b", 2)
    # When a consumer of "a" receives with a visibility timeout under a second
    taken = await engine.receive("a", max_messages=10, visibility_ms=500)
    # Then "a"'s rows came from the queue database, in order, and "b"'s stay in memory
    assert [d.message.id for d in taken] == in_a
    assert all("." in d.receipt for d in taken)
    assert engine.memory.sizes()["ready"] == 2
    assert [d.message.id for d in await engine.receive("b", max_messages=10)] == in_b


async def test_reads_of_no_queue_row_leave_the_rows_held_in_memory_there(
    make_engine, clock
) -> None:
    # Schedules keep their rows in the queue database beside the queues, never in memory: a
    # top-up (once a second) must not write out every row held, as a read of queue rows does.
    # Once it did, and every second's backlog then took both paths.
    engine = await make_engine()
    await engine.declare_queue("ticks", {})
    await engine.declare_queue("capped", {"max_length": 5, "overflow": "reject_publish"})
    await engine.put_schedule("yearly", {"cron": "0 0 1 1 *", "destination": "ticks"})
    ids = await _released(engine, clock, "q", 3)
    assert await engine.schedules.top_up_due() == 0  # its next occurrence is stored
    assert engine.memory.ready_in("q") == 3
    # Nor does an idempotent producer's send: rows kept in memory carry no key.
    keyed = [
        {"destination": "ticks", "body": "k", "message_id": f"k{i}", "delay_ms": 1000}
        for i in range(COLUMN_MIN)  # a batch big enough to be checked as columns
    ]
    assert all(r.id for r in await engine.send_batch(keyed))
    assert engine.memory.ready_in("q") == 3
    # Nor a send to a queue with a length limit, which never has rows in memory.
    assert (await engine.send({"destination": "capped", "body": "c"})).id
    assert engine.memory.ready_in("q") == 3
    taken = await engine.receive("q", max_messages=10)
    assert [d.message.id for d in taken] == ids
    assert all("." not in d.receipt for d in taken)  # from memory


async def test_dead_letter_groups_count_the_rows_held_in_memory_as_never_died(
    make_engine, clock
) -> None:
    # Given a dead-letter queue holding one message that died and plain messages sent to it
    # directly: 2 in memory (1 of them received), 1 in the queue database
    engine = await make_engine()
    await engine.declare_queue("dlq", {})
    await engine.declare_queue("q", {"dead_letter_to": "dlq"})
    await engine.send({"destination": "q", "body": "bad"})
    [bad] = await engine.receive("q")
    await engine.nack("q", [bad.receipt], requeue=False)
    [died] = await engine.receive("dlq")
    await engine.nack("dlq", [died.receipt], requeue=True)
    await _released(engine, clock, "dlq", 2)
    await engine.receive("dlq", max_messages=2)  # the one that died first, then one of these
    await engine.send({"destination": "dlq", "body": "now"})  # no delay: the database's path
    # Then the console's dead-letter view counts each where it is, writing nothing out
    expected = [
        {"reason": "", "original_destination": "", "count": 3, "oldest": 0, "newest": 0},
        {"reason": "rejected", "original_destination": "q", "count": 1},
    ]

    def shown(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in g.items() if g["reason"] == "" or k not in ("oldest", "newest")}
            for g in groups
        ]

    [view] = [v for v in await engine.dead_letters() if v["queue"] == "dlq"]
    assert shown(view["groups"]) == expected
    assert engine.memory.sizes() == {"ready": 1, "in_flight": 1, "acked": 0}
    # And as the queue database shows them once written out
    await engine.memory.write_out_all()
    [after] = [v for v in await engine.dead_letters() if v["queue"] == "dlq"]
    assert after["groups"] == view["groups"]
