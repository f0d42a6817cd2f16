"""Recurring schedules in the engine, step by step with a ManualClock, on the real stores: each
occurrence an ordinary scheduled message stored ahead, never stored twice (a restart, a node that
died between storing and recording, a second node), and the catch-up policies after downtime."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.engine.conftest import BOTH_STORES

from tarry.errors import NotFound, UnknownDestination
from tarry.model.message import Message
from tarry.model.query import MessageQuery

MINUTE = 60_000
#: Small numbers so a test sees several top-ups: 3 minutes ahead, 1 minute late is missed.
CONFIG = {"schedules": {"horizon_ms": 3 * MINUTE, "late_after_ms": MINUTE, "lease_ms": 5_000}}


@pytest.fixture(params=BOTH_STORES)
def engine_store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def stored(engine: Any, name: str = "tick") -> list[Message]:
    items, cursor = await engine.list_messages(
        MessageQuery(correlation_id=f"sched:{name}", limit=1000)
    )
    assert cursor is None
    return list(items)


async def deliver_until(
    engine: Any, clock: Any, until_ms: int, queue: str = "q", step_ms: int = MINUTE
) -> list[Any]:
    """Move the clock step by step to ``until_ms``, topping up and releasing as a running node
    would; returns every message received (and acked)."""
    got = []
    while clock.now_ms() < until_ms:
        clock.advance(min(step_ms, until_ms - clock.now_ms()))
        await engine.schedules.top_up_due()
        await engine.dispatcher.release_all_due()
        received = await engine.receive(queue, max_messages=100)
        if received:
            await engine.ack(queue, [d.receipt for d in received])
        got += [d.message for d in received]
    return got


def minute_floor(ms: int) -> int:
    return ms - ms % MINUTE


async def test_occurrences_are_stored_ahead_as_ordinary_scheduled_messages(
    make_engine, clock
) -> None:
    # Given a schedule every minute
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    info, created = await engine.put_schedule(
        "tick", {"cron": "* * * * *", "destination": "q", "body": "hi", "ttl_ms": 30_000}
    )
    # Then its next occurrences within the horizon (and the first past it) are stored
    first = minute_floor(clock.now_ms()) + MINUTE
    assert created and [o["at"] for o in info["next"][:2]] == [first, first + MINUTE]
    messages = await stored(engine)
    assert [m.message_id for m in messages] == [
        f"sched:tick:{first + i * MINUTE}" for i in range(4)
    ]
    assert all(m.state.value == "scheduled" and m.destination == "q" for m in messages)
    # each expires 30 s after its own time, however early it was stored
    assert [m.expires_at_ms - m.deliver_at_ms for m in messages] == [30_000] * 4
    assert info["planned_through"] == messages[-1].deliver_at_ms

    # When one occurrence is cancelled like any message, and time passes
    await engine.cancel(messages[1].id)
    got = await deliver_until(engine, clock, first + 5 * MINUTE)
    # Then every other occurrence is delivered once, at its time, and the cancelled one never
    ats = [int(m.message_id.rsplit(":", 1)[1]) for m in got]
    assert ats == [first + i * MINUTE for i in (0, 2, 3, 4, 5)]
    assert all(m.body == b"hi" for m in got)


async def test_a_top_up_that_was_not_recorded_is_stored_again_without_a_second_copy(
    make_engine, clock
) -> None:
    # Given occurrences stored by a top-up whose record never committed (a node died between)
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "q"})
    before = await stored(engine)
    await engine.cancel(before[1].id)  # and one of them cancelled by a user since
    await engine.qdb.write(
        lambda conn: conn.execute(
            "UPDATE schedules SET planned_through_ms = ?, owner = NULL", (clock.now_ms(),)
        )
    )
    # When the next top-up runs (this node, or another one later)
    assert await engine.schedules.top_up_due() == 1
    # Then it sends the same occurrences again and the store keeps each once
    after = await stored(engine)
    assert [m.id for m in after] == [m.id for m in before]
    got = await deliver_until(engine, clock, clock.now_ms() + 6 * MINUTE)
    counts = Counter(m.message_id for m in got)
    assert len(counts) == 5 and set(counts.values()) == {1}
    assert before[1].message_id not in counts  # the user's cancel holds


async def test_a_restarted_engine_delivers_every_occurrence_once(
    make_engine, clock, tmp_path: Path
) -> None:
    # Given a node that ran a schedule for a while
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "q"})
    start = clock.now_ms()
    got = await deliver_until(engine, clock, start + 3 * MINUTE + 30_000)
    # When it stops and starts again half a minute later (not late enough to be missed)
    await engine.stop()
    clock.advance(30_000)
    engine = await make_engine(CONFIG, data_dir=tmp_path / "data")
    got += await deliver_until(engine, clock, start + 8 * MINUTE)
    # Then every occurrence came once, none missing
    ats = [int(m.message_id.rsplit(":", 1)[1]) for m in got]
    first = minute_floor(start) + MINUTE
    assert ats == [first + i * MINUTE for i in range(8)]


@pytest.mark.parametrize("policy", ["skip", "once"])
async def test_after_downtime_missed_occurrences_are_skipped_or_delivered_once(
    make_engine, clock, tmp_path: Path, policy: str
) -> None:
    # Given a schedule every minute, its next few stored ahead
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "q", "catch_up": policy})
    start = clock.now_ms()
    # When no node runs for an hour (the stored ones fall overdue, later ones are never stored)
    await engine.stop()
    clock.advance(60 * MINUTE)
    engine = await make_engine(CONFIG, data_dir=tmp_path / "data")
    back = clock.now_ms()
    got = await deliver_until(engine, clock, back + 3 * MINUTE)
    # Then the occurrences of the downtime that are over a minute late are dropped (skip), or
    # one of them is delivered (once); those due since are delivered as usual
    ats = [int(m.message_id.rsplit(":", 1)[1]) for m in got]
    missed = [at for at in ats if at <= back - MINUTE]
    on_time = [at for at in ats if at > back - MINUTE]
    assert on_time == [minute_floor(back) + i * MINUTE for i in range(4)]
    if policy == "skip":
        assert missed == []
    else:
        assert missed == [minute_floor(back) - MINUTE] and len(ats) == len(set(ats))
    assert min(ats, default=back) > start


async def test_deleting_a_schedule_cancels_its_stored_occurrences(make_engine, clock) -> None:
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "q"})
    answer = await engine.delete_schedule("tick")
    assert answer == {"name": "tick", "deleted": True, "cancelled": 4}
    assert {m.state.value for m in await stored(engine)} == {"cancelled"}
    assert await deliver_until(engine, clock, clock.now_ms() + 5 * MINUTE) == []
    with pytest.raises(NotFound, match="no schedule named 'tick'"):
        await engine.get_schedule("tick")


async def test_a_replaced_schedule_delivers_the_new_message_once_per_occurrence(
    make_engine, clock
) -> None:
    # Given a schedule whose next occurrences are stored
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "q", "body": "old"})
    # When it is put again with the same times and another body
    info, created = await engine.put_schedule(
        "tick", {"cron": "* * * * *", "destination": "q", "body": "new"}
    )
    assert not created and info["body"] == "new"
    # Then the old occurrences are cancelled and the new ones delivered, each time once (the old
    # message_ids stay taken by the cancelled ones: the new revision's carry its revision)
    got = await deliver_until(engine, clock, clock.now_ms() + 4 * MINUTE)
    assert [m.body for m in got] == [b"new"] * 4
    assert all(m.message_id.endswith(f":{info['revision']}") for m in got)
    # And putting the same definition again changes nothing
    same, created = await engine.put_schedule(
        "tick", {"cron": "* * * * *", "destination": "q", "body": "new"}
    )
    assert same["revision"] == info["revision"] and not created


async def test_a_schedule_to_an_unknown_destination_is_refused_and_not_kept(make_engine) -> None:
    engine = await make_engine(CONFIG)
    with pytest.raises(UnknownDestination):
        await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "nowhere"})
    assert await engine.list_schedules() == []


@pytest.mark.parametrize("engine_store", [pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_two_nodes_share_a_schedule_through_its_lease(
    make_engine, clock, tmp_path: Path
) -> None:
    # Given two nodes on one PostgreSQL database, the first topping up an every-second
    # schedule (5 stored ahead at a time, so it needs a top-up every second)
    config = {"schedules": {**CONFIG["schedules"], "max_ahead": 5}}
    one = await make_engine(config, data_dir=tmp_path / "one")
    two = await make_engine(config, data_dir=tmp_path / "two")
    await one.declare_queue("q", {})
    start = clock.now_ms()
    await one.put_schedule("tick", {"cron": "* * * * * *", "destination": "q"})
    clock.advance(1_000)
    assert await one.schedules.top_up_due() == 1
    # Then the second does not top it up while the first's lease lives
    clock.advance(1_000)
    assert await two.schedules.top_up_due() == 0
    # When the first stops topping up (it died) and its lease lapses
    clock.advance(4_000)
    assert await two.schedules.top_up_due() == 1
    # Then the second goes on from where the first stopped: every second once, none missing
    # (once it has heard of the queue the first declared: nodes learn that through the
    # database's notifications, which a busy machine may deliver late)
    for _ in range(200):
        if "q" in two.catalog.queues:
            break
        await asyncio.sleep(0.05)
    got = await deliver_until(two, clock, start + 20_000, step_ms=1_000)
    ats = [int(m.message_id.rsplit(":", 1)[1]) for m in got]
    first = start - start % 1000 + 1000
    assert ats == list(range(first, start + 20_001, 1000))


async def test_a_leap_day_schedule_stores_its_next_29th_of_february_and_delivers_it_once(
    make_engine, clock
) -> None:
    # Given 09:00 Paris time on every 29th of February (the clock is in November 2023)
    engine = await make_engine(CONFIG)
    await engine.declare_queue("q", {})
    info, _ = await engine.put_schedule(
        "leap", {"cron": "0 9 29 2 *", "timezone": "Europe/Paris", "destination": "q"}
    )
    leap_2024 = 1_709_193_600_000  # 2024-02-29T08:00:00Z
    assert [o["local"] for o in info["next"][:2]] == [
        "2024-02-29T09:00:00+01:00",
        "2028-02-29T09:00:00+01:00",
    ]
    # Then that one occurrence is stored now, months ahead, as an ordinary scheduled message
    [message] = await stored(engine, "leap")
    assert (message.deliver_at_ms, message.message_id) == (leap_2024, f"sched:leap:{leap_2024}")
    # When the day comes
    clock.set(leap_2024 - 1)
    await engine.schedules.top_up_due()
    await engine.dispatcher.release_all_due()
    assert await engine.receive("q") == []
    got = await deliver_until(engine, clock, leap_2024 + MINUTE)
    # Then it is delivered once, and 2028's is stored next
    assert [m.message_id for m in got] == [f"sched:leap:{leap_2024}"]
    waiting = [m for m in await stored(engine, "leap") if m.state.value == "scheduled"]
    assert [m.deliver_at_ms for m in waiting] == [1_835_424_000_000]  # 2028-02-29T08:00:00Z


async def test_a_schedule_to_a_topic_gives_each_subscriber_each_occurrence_once(
    make_engine, clock
) -> None:
    engine = await make_engine(CONFIG)
    for queue in ("a", "b"):
        await engine.declare_queue(queue, {})
    await engine.declare_topic("news")
    for queue in ("a", "b"):
        await engine.subscribe("news", queue)
    await engine.put_schedule("tick", {"cron": "* * * * *", "destination": "news"})
    start = clock.now_ms()
    got_a = await deliver_until(engine, clock, start + 3 * MINUTE, queue="a")
    received = await engine.receive("b", max_messages=100)
    assert [m.message_id for m in got_a] == [d.message.message_id for d in received]
    assert len(got_a) == 3 and len({m.message_id for m in got_a}) == 3
    # Deleting it cancels every subscriber's stored copy
    answer = await engine.delete_schedule("tick")
    assert answer["cancelled"] >= 2 and answer["cancelled"] % 2 == 0
