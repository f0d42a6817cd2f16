"""One behaviour suite for every DelayedStore (practice 3): the embedded SQLite store on a real
file, the PostgreSQL store on its own database of the real server, and the in-memory store; and
for the two that share the queue database, what they do inside the engine's queue transaction
(``SharedDelayedStore``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.store.test_log_recovery import crash as crash_log_store

from tarry.errors import NotCancellable, NotFound, PreconditionFailed
from tarry.model.accepted import AcceptedColumns
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState
from tarry.store.base import ColumnStore, LeavingStore, SharedDelayedStore
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


@asynccontextmanager
async def opened(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """The store ``kind``, open; every store test ends with its integrity check."""
    if kind == "postgres":
        from tarry.store.postgres import PostgresStore

        p = PostgresStore(request.getfixturevalue("pg_dsn"))
        await p.open()
        yield p
        assert await p.check() == []
        await p.close()
    elif kind == "sqlite":
        s = SQLiteStore(tmp_path / "tarry.db")
        await s.open()
        yield s
        assert await s.check() == []
        await s.close()
    elif kind == "log":
        s = LogStore(tmp_path / "log", granularity_ms=60_000)
        await s.open()
        yield s
        assert await s.check() == []
        await s.close()
    else:
        yield MemoryStore()


POSTGRES = pytest.param("postgres", marks=pytest.mark.postgres)


@pytest.fixture(params=["log", "sqlite", POSTGRES, "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    async with opened(request.param, request, tmp_path) as opened_store:
        yield opened_store


@pytest.fixture(params=["sqlite", POSTGRES])
async def shared_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SharedDelayedStore]:
    """The stores whose scheduled messages are rows of the queue database."""
    async with opened(request.param, request, tmp_path) as opened_store:
        assert opened_store.shares_queue_database
        yield opened_store


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


async def test_each_claim_lapses_at_its_own_lease_however_they_were_taken(store) -> None:
    # Given a long claim, then a short one taken after it
    long, short, late = message(0), message(1), message(400)
    await store.store([long, short, late])
    assert [x.id for x in await store.fetch_due(NOW, limit=1, lease_ms=10_000)] == [long.id]
    assert [x.id for x in await store.fetch_due(NOW + 1, limit=1, lease_ms=100)] == [short.id]
    # Then the short claim lapses at its own time and not before, a message falling due
    # meanwhile is taken as usual, and the long claim stays out until its lease ends
    hour = 3_600_000
    assert await store.fetch_due(NOW + 100, limit=10, lease_ms=hour) == []
    assert [x.id for x in await store.fetch_due(NOW + 101, limit=10, lease_ms=hour)] == [short.id]
    assert [x.id for x in await store.fetch_due(NOW + 400, limit=10, lease_ms=hour)] == [late.id]
    assert await store.fetch_due(NOW + 9_999, limit=10, lease_ms=hour) == []
    assert [x.id for x in await store.fetch_due(NOW + 10_000, limit=10, lease_ms=1)] == [long.id]


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


# --- SharedDelayedStore: inside the caller's queue transaction ---------------------------------
async def test_a_message_kept_inside_the_queue_transaction_is_kept_once_it_commits(
    shared_store: SharedDelayedStore,
) -> None:
    # Given a message kept through store_in inside a queue-database transaction
    m = message(0)
    [outcome] = await shared_store.write(lambda conn: shared_store.store_in(conn, [m]))
    # Then it is kept and falls due like one given to store()
    assert outcome.created
    assert (await shared_store.get(m.id)).state is MessageState.SCHEDULED
    assert [x.id for x in await shared_store.fetch_due(NOW, limit=10, lease_ms=10)] == [m.id]


async def test_a_message_kept_inside_a_queue_transaction_that_rolls_back_is_not_kept(
    shared_store: SharedDelayedStore,
) -> None:
    # Given a transaction that keeps a message and then fails (its queue refused the send)
    m = message(0)

    def work(conn: Any) -> None:
        shared_store.store_in(conn, [m])
        raise PreconditionFailed("the queue refused it")

    # When it runs, the failure reaches the caller
    with pytest.raises(PreconditionFailed):
        await shared_store.write(work)
    # Then nothing of it was kept
    assert await shared_store.get(m.id) is None
    assert await shared_store.count_scheduled() == 0


async def test_store_in_returns_the_kept_message_for_a_repeated_message_id(
    shared_store: SharedDelayedStore,
) -> None:
    first, again = message(100, message_id="order-1"), message(200, message_id="order-1")
    await shared_store.write(lambda conn: shared_store.store_in(conn, [first]))
    [outcome] = await shared_store.write(lambda conn: shared_store.store_in(conn, [again]))
    assert not outcome.created
    assert outcome.message.id == first.id
    assert await shared_store.get(again.id) is None


async def test_lock_for_give_up_takes_a_scheduled_message_and_not_a_cancelled_one(
    shared_store: SharedDelayedStore,
) -> None:
    # Given a scheduled message and a cancelled one
    kept, cancelled = message(0), message(0)
    await shared_store.store([kept, cancelled])
    await shared_store.cancel(cancelled.id, now_ms=NOW)

    # When a transaction locks each for giving up after three failures
    def work(conn: Any) -> tuple[bool, bool]:
        return (
            shared_store.lock_for_give_up(conn, kept.id, failures=3),
            shared_store.lock_for_give_up(conn, cancelled.id, failures=3),
        )

    # Then the scheduled one is taken with its failures counted, the cancelled one left alone
    assert await shared_store.write(work) == (True, False)
    assert (await shared_store.get(kept.id)).failures == 3
    got = await shared_store.get(cancelled.id)
    assert (got.state, got.failures) == (MessageState.CANCELLED, 0)


# --- ColumnStore: plain messages given as columns ---------------------------------------------
def plain_columns(dues: list[int], destination: str = "q") -> AcceptedColumns:
    due = np.array([NOW + d for d in dues], np.int64)
    return AcceptedColumns(
        rows=list(range(len(dues))),
        ids=[i.decode() for i in ids.new_due_many(NOW, due).tolist()],
        destination=[destination] * len(dues),
        body=[b"body %d" % i for i in range(len(dues))],
        sent_at_ms=NOW,
        deliver_at_ms=due,
        expires_at_ms=np.array([-1 if i % 2 else NOW + 10**9 for i in range(len(dues))]),
    )


async def test_plain_messages_given_as_columns_are_kept_as_store_keeps_them(store) -> None:
    # Given plain messages as columns, kept through ``store_columns`` where the store has it
    # and through ``store`` of their object form where it has not (what the engine does)
    batch = plain_columns([300, 100, 10**10, 200])
    if isinstance(store, ColumnStore):
        await store.store_columns(batch)
    else:
        assert all(o.created for o in await store.store(batch.messages()))
    # Then each reads back as its object form, and falls due as any stored message does
    for m in batch.messages():
        assert await store.get(m.id) == m
    assert await store.count_scheduled("q") == 4
    assert await store.next_due_time() == NOW + 100
    due = await store.fetch_due(NOW + 300, limit=10, lease_ms=1000)
    assert [m.deliver_at_ms for m in due] == [NOW + 100, NOW + 200, NOW + 300]
    assert await store.fetch_due(NOW + 1200, limit=10, lease_ms=1000) == []  # the far one


async def test_the_log_store_keeps_columns_without_messages_and_the_others_take_objects(
    store,
) -> None:
    # The engine picks the column path once, by this check (``engine/sending.py``).
    assert isinstance(store, ColumnStore) is isinstance(store, LogStore)


@dataclass
class Restartable:
    """A store that can keep a released message out of circulation unended (``LeavingStore``,
    what local queues kept in memory need): opened on the same files each time, and stopped
    as kill -9 stops it."""

    open: Callable[[], Awaitable[Any]]
    crash: Callable[[Any], Awaitable[None]]


@pytest.fixture(params=["log"])
def restartable(request: pytest.FixtureRequest, tmp_path: Path) -> Restartable:
    assert request.param == "log"

    async def open_store() -> Any:
        store = LogStore(tmp_path / "log", granularity_ms=60_000)
        await store.open()
        assert isinstance(store, LeavingStore)
        return store

    return Restartable(open_store, crash_log_store)


async def test_a_message_left_is_out_of_circulation_until_ended_and_ended_for_good(
    restartable,
) -> None:
    store = await restartable.open()
    # Given two due messages claimed, one of which may leave and does
    kept, other = message(0), message(0)
    await store.store([kept, other])
    assert not store.may_leave([kept.id])  # not claimed yet
    await store.fetch_due(NOW, limit=10, lease_ms=1000)
    assert store.may_leave([kept.id, other.id])
    store.leave([kept.id])
    store.release_claims([other.id])
    # Then it is neither scheduled nor fetched again, however long after its lease
    assert not store.may_leave([kept.id])
    assert await store.count_scheduled() == 1
    later = await store.fetch_due(NOW + 60_000, limit=10, lease_ms=1000)
    assert [m.id for m in later] == [other.id]
    # And once ended (once), not even a crash brings it back
    end = {"state": MessageState.ACKED, "now_ms": NOW, "durable": True}
    assert await store.finish_left([kept.id], **end) == 1
    assert await store.finish_left([kept.id], **end) == 0
    await restartable.crash(store)
    store = await restartable.open()
    due = await store.fetch_due(NOW + 120_000, limit=10, lease_ms=1000)
    assert [m.id for m in due] == [other.id]
    assert await store.check() == []
    await store.close()


async def test_a_message_left_and_never_ended_is_due_again_after_a_crash(restartable) -> None:
    store = await restartable.open()
    m = message(0)
    await store.store([m])
    await store.fetch_due(NOW, limit=10, lease_ms=1000)
    store.leave([m.id])
    await restartable.crash(store)
    store = await restartable.open()
    assert [d.id for d in await store.fetch_due(NOW, limit=10, lease_ms=1000)] == [m.id]
    assert await store.check() == []
    await store.close()
