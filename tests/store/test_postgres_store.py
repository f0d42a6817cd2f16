"""The PostgreSQL store beyond the common contract: several claimers on one database, leases
that lapse, migrations, wake-ups between nodes, and losing the connection. Real server only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest

from tarry.errors import Unavailable
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.postgres import PostgresStore
from tarry.store.postgres.schema import SCHEMA_VERSION

pytestmark = pytest.mark.postgres

NOW = 1_700_000_000_000
ids = IdGenerator()


def message(due_in_ms: int = 0, destination: str = "q") -> Message:
    return Message(
        id=ids.new(NOW),
        destination=destination,
        body=b"x",
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=NOW + due_in_ms,
        expires_at_ms=None,
        updated_at_ms=NOW,
    )


@pytest.fixture
async def open_store(pg_dsn: str) -> AsyncIterator[Callable[..., object]]:
    stores: list[PostgresStore] = []

    async def factory(**kwargs: object) -> PostgresStore:
        store = PostgresStore(pg_dsn, **kwargs)  # type: ignore[arg-type]
        await store.open()
        stores.append(store)
        return store

    yield factory
    for store in stores:
        assert await store.check() == []
        await store.close()


async def test_two_nodes_fetching_at_once_never_claim_the_same_message(open_store) -> None:
    # Given 600 due messages and two stores (two nodes) on one database
    a, b = await open_store(node="a"), await open_store(node="b")
    batch = [message(i % 50) for i in range(600)]
    await a.store(batch)
    claimed: dict[str, list[str]] = {"a": [], "b": []}

    async def drain(store: PostgresStore, name: str) -> None:
        while True:
            got = await store.fetch_due(NOW + 1000, limit=25, lease_ms=60_000)
            if not got:
                return
            claimed[name] += [m.id for m in got]

    # When both fetch concurrently until nothing is left
    await asyncio.gather(drain(a, "a"), drain(b, "b"), drain(a, "a"), drain(b, "b"))
    # Then every message was claimed exactly once, and both nodes took a share
    every = claimed["a"] + claimed["b"]
    assert sorted(every) == sorted(m.id for m in batch)
    assert len(set(every)) == len(every)
    assert claimed["a"] and claimed["b"]


async def test_a_dead_nodes_claims_lapse_after_the_lease_and_another_node_takes_them(
    open_store,
) -> None:
    # Given node a claimed two messages with a 5 s lease and then died (never released them)
    a, b = await open_store(node="a"), await open_store(node="b")
    batch = [message(0), message(1)]
    await a.store(batch)
    assert len(await a.fetch_due(NOW + 10, limit=10, lease_ms=5000)) == 2
    # Then the next due time is when the lease lapses, and b gets nothing before it
    assert await b.next_due_time() == NOW + 10 + 5000
    assert await b.fetch_due(NOW + 5009, limit=10, lease_ms=5000) == []
    # When the lease has lapsed, b claims them
    taken = await b.fetch_due(NOW + 5010, limit=10, lease_ms=5000)
    assert sorted(m.id for m in taken) == sorted(m.id for m in batch)
    # And a, come back late, can neither count a failure on them nor release them
    assert await a.record_failure(batch[0].id, error="late", retry_at_ms=NOW) == 0
    held_by_a = await a.write(lambda conn: a.release_claimed(conn, [m.id for m in batch]))
    held_by_b = await b.write(lambda conn: b.release_claimed(conn, [m.id for m in batch]))
    assert held_by_a == set() and held_by_b == {m.id for m in batch}
    # And b finishes them once
    assert await b.remove([m.id for m in batch], state=MessageState.DELIVERED, now_ms=NOW) == 2
    assert await a.remove([m.id for m in batch], state=MessageState.DELIVERED, now_ms=NOW) == 0


async def test_a_failure_releases_the_claim_and_counts(open_store) -> None:
    a = await open_store(node="a")
    m = message(0)
    await a.store([m])
    await a.fetch_due(NOW, limit=1, lease_ms=60_000)
    assert await a.record_failure(m.id, error="boom", retry_at_ms=NOW + 100) == 1
    assert await a.next_due_time() == NOW + 100
    [again] = await a.fetch_due(NOW + 100, limit=1, lease_ms=60_000)
    assert (again.failures, again.last_error) == (1, "boom")


async def test_the_schema_is_created_once_and_a_newer_schema_is_refused(
    open_store, pg_dsn: str
) -> None:
    # Given three nodes starting at the same moment on an empty database
    await asyncio.gather(*(open_store() for _ in range(3)))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM tarry_schema").fetchall() == [(SCHEMA_VERSION,)]
        # When a newer tarry has migrated the database past this one
        conn.execute("UPDATE tarry_schema SET version = %s", (SCHEMA_VERSION + 1,))
    # Then this tarry refuses to start on it, and says what to do
    with pytest.raises(Unavailable, match="newer than this tarry understands"):
        await PostgresStore(pg_dsn).open()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE tarry_schema SET version = %s", (SCHEMA_VERSION,))


async def test_the_next_due_query_is_an_index_range_scan(open_store, pg_dsn: str) -> None:
    a = await open_store()
    await a.store([message(i) for i in range(2000)])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE messages")
        conn.execute("SET enable_seqscan = off")  # a tiny table: make the planner show its index
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT id FROM messages WHERE state = 'scheduled' "
                "AND deliver_at_ms <= 1 ORDER BY deliver_at_ms, id LIMIT 500"
            )
        )
    assert "messages_due" in plan and "Index" in plan


async def test_a_message_stored_on_one_node_wakes_the_other(open_store) -> None:
    a, b = await open_store(node="a"), await open_store(node="b")
    woke: asyncio.Queue[int] = asyncio.Queue()
    await b.listener.stop()  # open() started it: subscribe, then start it again
    b.on_due(woke.put_nowait)
    b.listener.start()
    await asyncio.wait_for(b.listener.listening.wait(), 5)
    m = message(1234)
    await a.store([m])
    assert await asyncio.wait_for(woke.get(), 5) == m.deliver_at_ms


async def test_a_catalog_change_made_before_listen_is_in_force_still_reaches_a_node(
    open_store, pg_dsn: str
) -> None:
    # Given a node whose listener has not yet LISTENed (a node starting: its catalog is read,
    # its LISTEN connection still on its way)
    b = await open_store(node="b")
    reloads: asyncio.Queue[None] = asyncio.Queue()
    await b.listener.stop()
    b.on_catalog_change(lambda: reloads.put_nowait(None))
    # When another node declares a queue then (the trigger's NOTIFY reaches no one here)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO queues (name, args, created_at_ms, last_used_ms) VALUES ('q', '{}', 0, 0)"
        )
    # Then once its LISTEN is in force it reloads the catalog all the same
    b.listener.start()
    await asyncio.wait_for(b.listener.listening.wait(), 5)
    await asyncio.wait_for(reloads.get(), 5)


async def test_losing_the_connection_raises_unavailable_and_the_store_recovers(
    open_store, pg_dsn: str
) -> None:
    # Given a store with a message in it
    a = await open_store()
    m = message(0)
    await a.store([m])
    # When PostgreSQL drops every connection of this database (as a restart does)
    name = pg_dsn.rsplit("/", 1)[1]
    with psycopg.connect(pg_dsn.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
    # Then calls fail with Unavailable (never another error) until the pools reconnect
    errors = 0
    for _ in range(50):
        try:
            got = await a.get(m.id)
            break
        except Unavailable:
            errors += 1
            await asyncio.sleep(0.1)
    else:
        pytest.fail("the store did not recover")
    assert got is not None and got.id == m.id
    assert await a.db.run(lambda conn: conn.execute("SELECT 1").fetchone()) in ((1,), [1])


async def test_an_unreachable_server_is_a_clear_unavailable_error() -> None:
    store = PostgresStore("postgresql://postgres:secret@127.0.0.1:1/nowhere")
    with pytest.raises(Unavailable) as caught:
        await store.open()
    assert "cannot open the PostgreSQL store" in caught.value.message
    assert "secret" not in caught.value.message


async def test_rows_taken_inside_a_release_are_skipped_by_others_and_free_at_once_if_it_dies(
    open_store, pg_dsn: str
) -> None:
    from tarry.store.postgres.dialect import PgConnection

    # Given ten due messages, and node a inside its fetch-and-release transaction
    a, b = await open_store(node="a"), await open_store(node="b")
    batch = [message(i) for i in range(10)]
    await a.store(batch)
    raw = psycopg.connect(pg_dsn)
    taken = a.claim_due(PgConnection(raw), now_ms=NOW + 100, limit=10)
    assert len(taken) == 10
    # Then node b skips those rows instead of waiting for them
    assert await b.fetch_due(NOW + 100, limit=10, lease_ms=60_000) == []
    # When node a dies inside the transaction (its connection goes away, nothing committed)
    raw.close()
    # Then the messages are due again as soon as the server has noticed (no 60 s lease to wait
    # out, and the clock passed to fetch_due does not move)
    again: list[Message] = []
    for _ in range(100):
        again = await b.fetch_due(NOW + 100, limit=10, lease_ms=60_000)
        if again:
            break
        await asyncio.sleep(0.05)
    assert sorted(m.id for m in again) == sorted(m.id for m in batch)


async def test_a_held_claim_falls_due_again_at_the_hold_not_after_the_whole_lease(
    open_store,
) -> None:
    # Given node a claimed a message with a 30 s lease, and its destination turned out to be away
    a, b = await open_store(node="a"), await open_store(node="b")
    m = message(0)
    await a.store([m])
    assert [x.id for x in await a.fetch_due(NOW, limit=10, lease_ms=30_000)] == [m.id]
    # When a holds it back for 1 s (no failure counted)
    a.hold_claims([m.id], until_ms=NOW + 1000)
    await a.settle()
    # Then it is due again after 1 s, for any node, with no failure on it
    assert await b.next_due_time() == NOW + 1000
    assert await b.fetch_due(NOW + 999, limit=10, lease_ms=30_000) == []
    [again] = await b.fetch_due(NOW + 1000, limit=10, lease_ms=30_000)
    assert again.id == m.id and again.failures == 0
    # And a hold from a node that no longer owns the claim changes nothing
    a.hold_claims([m.id], until_ms=NOW + 2000)
    await a.settle()
    assert await a.fetch_due(NOW + 2000, limit=10, lease_ms=30_000) == []
