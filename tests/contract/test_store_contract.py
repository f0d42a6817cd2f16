"""One behaviour suite for every DelayedStore (practice 3): the embedded SQLite store on a real
file, the PostgreSQL store on its own database of the real server, and the in-memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tarry.errors import NotCancellable, NotFound
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.memory import MemoryStore
from tarry.store.sqlite import SQLiteStore

NOW = 1_700_000_000_000
ids = IdGenerator()


def message(
    due_in_ms: int = 0, *, destination: str = "q", message_id: str | None = None
) -> Message:
    return Message(
        id=ids.new_due(NOW, NOW + due_in_ms),
        destination=destination,
        body=b"hello",
        headers={"k": "v"},
        sent_at_ms=NOW,
        deliver_at_ms=NOW + due_in_ms,
        expires_at_ms=None,
        message_id=message_id,
        updated_at_ms=NOW,
    )


@pytest.fixture(
    params=["log", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "memory"]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "postgres":
        from tarry.store.postgres import PostgresStore

        p = PostgresStore(request.getfixturevalue("pg_dsn"))
        await p.open()
        yield p
        assert await p.check() == []
        await p.close()
    elif request.param == "sqlite":
        s = SQLiteStore(tmp_path / "tarry.db")
        await s.open()
        yield s
        assert await s.check() == []  # every store test ends with an integrity check
        await s.close()
    elif request.param == "log":
        s = LogStore(tmp_path / "log", granularity_ms=60_000)
        await s.open()
        yield s
        assert await s.check() == []
        await s.close()
    else:
        yield MemoryStore()


async def test_stored_message_can_be_read_back_unchanged(store) -> None:
    m = message(5000)
    [outcome] = await store.store([m])
    assert outcome.created
    got = await store.get(m.id)
    assert got is not None
    assert (got.body, got.headers, got.deliver_at_ms, got.state) == (
        b"hello",
        {"k": "v"},
        NOW + 5000,
        MessageState.SCHEDULED,
    )


async def test_fetch_due_never_returns_a_message_before_its_time(store) -> None:
    early, late = message(1000), message(2000)
    await store.store([late, early])
    assert await store.fetch_due(NOW + 999, limit=10, lease_ms=1000) == []
    due = await store.fetch_due(NOW + 1000, limit=10, lease_ms=1000)
    assert [m.id for m in due] == [early.id]


async def test_fetch_due_returns_oldest_due_first_and_respects_the_limit(store) -> None:
    batch = [message(d) for d in (30, 10, 20)]
    await store.store(batch)
    due = await store.fetch_due(NOW + 100, limit=2, lease_ms=1000)
    assert [m.deliver_at_ms for m in due] == [NOW + 10, NOW + 20]


async def test_a_claimed_message_is_not_fetched_again_until_its_lease_ends(store) -> None:
    m = message(0)
    await store.store([m])
    assert len(await store.fetch_due(NOW, limit=10, lease_ms=1000)) == 1
    assert await store.fetch_due(NOW + 500, limit=10, lease_ms=1000) == []
    assert [x.id for x in await store.fetch_due(NOW + 1000, limit=10, lease_ms=1000)] == [m.id]


async def test_next_due_time_is_the_earliest_unclaimed_due_time(store) -> None:
    assert await store.next_due_time() is None
    await store.store([message(300), message(100)])
    assert await store.next_due_time() == NOW + 100


async def test_removed_message_is_finished_and_not_fetched_again(store) -> None:
    m = message(0)
    await store.store([m])
    await store.fetch_due(NOW, limit=1, lease_ms=10)
    assert await store.remove([m.id], state=MessageState.DELIVERED, now_ms=NOW) == 1
    assert await store.remove([m.id], state=MessageState.DELIVERED, now_ms=NOW) == 0
    assert await store.fetch_due(NOW + 100, limit=10, lease_ms=10) == []
    assert (await store.get(m.id)).state is MessageState.DELIVERED


async def test_a_failure_is_counted_and_holds_the_message_back_until_retry_time(store) -> None:
    m = message(0)
    await store.store([m])
    await store.fetch_due(NOW, limit=1, lease_ms=10_000)
    assert await store.record_failure(m.id, error="boom", retry_at_ms=NOW + 2000) == 1
    assert await store.fetch_due(NOW + 1999, limit=1, lease_ms=10) == []
    [again] = await store.fetch_due(NOW + 2000, limit=1, lease_ms=10)
    assert again.failures == 1 and again.last_error == "boom"


async def test_a_repeated_message_id_for_the_same_destination_stores_nothing_new(store) -> None:
    first, second = message(0, message_id="m-1"), message(0, message_id="m-1")
    other = message(0, message_id="m-1", destination="other")
    outcomes = await store.store([first, second, other])
    assert [o.created for o in outcomes] == [True, False, True]
    assert outcomes[1].message.id == first.id


async def test_a_rerun_of_a_whole_batch_returns_each_kept_message_as_get_reads_it(store) -> None:
    # More repeats than the log store finds one by one, some cancelled and some moved to a
    # later partition since: the batch's answer must agree with ``get`` for every one.
    first = [message(1000 + i, message_id=f"m-{i}") for i in range(30)]
    await store.store(first)
    for m in first[:5]:
        await store.cancel(m.id, now_ms=NOW)
    for m in first[5:10]:
        await store.reschedule(m.id, deliver_at_ms=NOW + 600_000, now_ms=NOW)
    rerun = [message(1000 + i, message_id=f"m-{i}") for i in range(30)]
    outcomes = await store.store([*rerun, message(0, message_id="m-3")])
    assert not any(o.created for o in outcomes)
    assert [o.message.id for o in outcomes] == [m.id for m in first] + [first[3].id]
    for outcome in outcomes:
        kept = await store.get(outcome.message.id)
        assert kept is not None
        assert (outcome.message.state, outcome.message.deliver_at_ms) == (
            kept.state,
            kept.deliver_at_ms,
        )
    assert {o.message.state for o in outcomes[:5]} == {MessageState.CANCELLED}
    assert {o.message.deliver_at_ms for o in outcomes[5:10]} == {NOW + 600_000}


async def test_cancel_ends_a_scheduled_message_and_refuses_twice(store) -> None:
    m = message(1000)
    await store.store([m])
    assert (await store.cancel(m.id, now_ms=NOW)).state is MessageState.CANCELLED
    assert await store.fetch_due(NOW + 5000, limit=10, lease_ms=10) == []
    with pytest.raises(NotCancellable):
        await store.cancel(m.id, now_ms=NOW)
    with pytest.raises(NotFound):
        await store.cancel("nope", now_ms=NOW)


async def test_a_message_being_delivered_cannot_be_cancelled(store) -> None:
    m = message(0)
    await store.store([m])
    await store.fetch_due(NOW, limit=1, lease_ms=10_000)
    with pytest.raises(NotCancellable):
        await store.cancel(m.id, now_ms=NOW)


async def test_reschedule_moves_the_due_time(store) -> None:
    m = message(1000)
    await store.store([m])
    await store.reschedule(m.id, deliver_at_ms=NOW + 5000, now_ms=NOW)
    assert await store.fetch_due(NOW + 1000, limit=10, lease_ms=10) == []
    assert len(await store.fetch_due(NOW + 5000, limit=10, lease_ms=10)) == 1


async def test_list_pages_through_messages_in_due_order(store) -> None:
    batch = [message(d, destination="a" if d % 2 else "b") for d in range(10)]
    await store.store(batch)
    page, cursor = await store.list(MessageQuery(limit=4))
    assert [m.deliver_at_ms - NOW for m in page] == [0, 1, 2, 3]
    page2, cursor2 = await store.list(MessageQuery(limit=4, cursor=cursor))
    assert [m.deliver_at_ms - NOW for m in page2] == [4, 5, 6, 7]
    only_a, _ = await store.list(MessageQuery(destination="a", due_before_ms=NOW + 6))
    assert [m.deliver_at_ms - NOW for m in only_a] == [1, 3, 5]
    assert await store.count_scheduled() == 10


async def test_due_counts_count_scheduled_messages_by_window_and_leave_out_cancelled_ones(
    store,
) -> None:
    # Given messages due in the 1st, 2nd and 4th minute from NOW (one of them cancelled), and
    # one due before the windows and one after them
    minute = 60_000
    start = NOW - NOW % minute + minute  # whole minutes: the log store's partitions here
    dues = [start + 5, start + 10, start + minute + 1, start + 3 * minute + 59_999]
    kept = [message(d - NOW) for d in dues]
    outside = [message(start - 1 - NOW), message(start + 4 * minute - NOW)]
    cancelled = message(start + 20 - NOW)
    await store.store([*kept, *outside, cancelled])
    await store.cancel(cancelled.id, now_ms=NOW)
    # When the store counts four one-minute windows from start
    counts = await store.due_counts(start, minute, 4)
    # Then each window has its messages, and wider windows add up the same
    assert counts == [2, 1, 0, 1]
    assert await store.due_counts(start, 2 * minute, 2) == [3, 1]
    assert await store.due_counts(start, minute, 0) == []
