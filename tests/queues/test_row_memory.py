"""Receives of rows the SQLite queue database released and acks of rows it handed out, from its
memory of them (``store/sqlite/row_memory.py``, ``queues/ready_rows.py``,
``queues/receipts.ack_handed_out``): the same rows, counts, unknown receipts and messages as
reading the rows, without reading every column; the memory is never the truth (a row no
longer in flight under the receipt is not acked)."""

from __future__ import annotations

import copy
import random
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from tarry.engine.types import Deliveries, Delivery
from tarry.model.ids import IdGenerator
from tarry.model.message import Death, DeathReason, Message
from tarry.model.queue_args import QueueArgs
from tarry.queues.catalog import Catalog, QueueEntry
from tarry.queues.sequence import Sequencer
from tarry.queues.ttl_change import restamp_expiry
from tarry.queues.txn import QueueTxn
from tarry.server.responses import received
from tarry.store.sqlite.database import _connect
from tarry.store.sqlite.row_memory import RowMemory
from tarry.store.sqlite.rows import COLUMNS, SELECT_SQL
from tarry.store.sqlite.schema import is_keyed, migrate

NOW = 1_700_000_000_000
IDS = IdGenerator()


def _database(path: Path, *, memory: bool) -> sqlite3.Connection:
    conn = _connect(str(path))
    migrate(conn, queues_only=True)
    conn.keyed = is_keyed(conn)
    conn.released = RowMemory() if memory else None
    conn.handed_out = RowMemory() if memory else None
    return conn


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = _database(tmp_path / "queues.db", memory=True)
    yield conn
    conn.close()


class Queue:
    """One queue ``orders`` of ``conn``, each call its own transaction at its own time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.catalog = Catalog()
        self.catalog.queues["orders"] = QueueEntry("orders", QueueArgs(), NOW, NOW)
        self.catalog.recompute()
        self.seq = Sequencer()
        self.events: list[Any] = []

    def run(self, now_ms: int, work: Callable[[QueueTxn], Any]) -> Any:
        txn = QueueTxn(
            self.conn,
            now_ms=now_ms,
            catalog=self.catalog,
            ids=IDS,
            seq=self.seq,
            waiting={},
            error_queue="tarry.errors",
        )
        self.conn.execute("BEGIN")
        result = work(txn)
        txn.flush()
        self.conn.execute("COMMIT")
        self.events += txn.events
        for run in txn.runs:
            self.events += run
        return result

    def release(self, batch: list[Message]) -> None:
        self.run(NOW, lambda txn: txn.enqueue_many(copy.deepcopy(batch), "orders"))

    def receive(self, now_ms: int, count: int, visibility_ms: int = 1000) -> list[str]:
        taken = self.run(
            now_ms,
            lambda txn: txn.receive("orders", max_messages=count, visibility_ms=visibility_ms),
        )
        return [receipt for _, receipt in taken]

    def received(self, count: int) -> list[str]:
        """``count`` messages released, then received at once: their receipts."""
        self.release(BATCH[:count])
        return self.receive(NOW + 1, count)

    def ack(self, now_ms: int, receipts: list[str]) -> tuple[int, list[str]]:
        return self.run(  # type: ignore[no-any-return]
            now_ms, lambda txn: txn.settle("orders", receipts, ack=True, requeue=False)
        )


def _message(i: int) -> Message:
    return Message(
        id=IDS.new(NOW),
        destination="orders",
        body=b"" if i == 4 else b"body %d" % i,
        headers={"n": str(i)} if i % 2 else {},
        sent_at_ms=NOW - 10,
        deliver_at_ms=NOW,
        expires_at_ms=NOW + 60_000 if i == 2 else None,
        updated_at_ms=NOW,
    )


BATCH = [_message(i) for i in range(6)]
#: Every column, receipts (made anew in each run) only as whether there is one.
_ALL_BUT_RECEIPT = (
    f"SELECT {', '.join(c for c in COLUMNS if c != 'receipt')}, receipt IS NULL FROM messages"
)


def _statements(conn: sqlite3.Connection) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen


def test_an_ack_from_memory_leaves_what_reading_the_rows_leaves(tmp_path: Path) -> None:
    """Rows, counts, unknown receipts (a repeat, a stale one, a made-up one: those are looked
    up) and the acked events' messages are the same with the memory as without it; with it, an
    ack of remembered receipts reads no row."""
    outcomes = []
    for memory in (False, True):
        conn = _database(tmp_path / f"{memory}.db", memory=memory)
        queue = Queue(conn)
        queue.release(BATCH)
        first = queue.receive(NOW + 1, 4)
        # Two of them come back after their visibility timeout: a redelivery, new receipts.
        queue.ack(NOW + 2, first[:2])
        again = queue.receive(NOW + 5_000, 3)
        receipts = [*again, again[0], first[2], "01AAAA.999"]
        done, unknown = queue.ack(NOW + 5_001, receipts)
        result = (done, [receipts.index(r, 1) for r in unknown])
        rest = queue.receive(NOW + 5_002, 6)
        seen = _statements(conn)
        assert queue.ack(NOW + 5_003, rest) == (len(rest), [])
        conn.set_trace_callback(None)
        reads = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
        acked = [copy.copy(e[1]) for e in queue.events if e[0] == "acked"]
        rows = conn.execute(f"{_ALL_BUT_RECEIPT} ORDER BY rowid").fetchall()
        outcomes.append((result, acked, rows, reads))
        conn.close()
    (plain, plain_acked, plain_rows, plain_reads), (kept, kept_acked, kept_rows, reads) = outcomes
    assert kept == plain
    assert kept == (3, [3, 4, 5])  # the repeat, the stale one and the made-up one
    assert kept_acked == plain_acked
    assert kept_rows == plain_rows
    assert plain_reads and not reads


@pytest.mark.parametrize("memory", [True, False])
def test_a_receive_is_answered_from_its_rows_as_from_its_messages(
    tmp_path: Path, memory: bool
) -> None:
    """A receive's HTTP answer written from the rows it took (``Deliveries``) is byte for byte
    the general path's (``Delivery.to_public`` of each message), for plain messages and the
    others (headers, deaths, producer ids, an expiry, a body that is not text), first
    deliveries and redeliveries alike."""
    # Given a queue holding every kind of message, remembered at their release or not
    death = Death(DeathReason.EXPIRED, "orders", 1_500, 1, "orders")
    odd = [
        replace(BATCH[0], id=IDS.new(NOW), message_id='m"1', correlation_id="c\n1"),
        replace(BATCH[0], id=IDS.new(NOW), deaths=[death]),
        replace(BATCH[0], id=IDS.new(NOW), body='é ✓ 😀 " %'.encode()),
        replace(BATCH[0], id=IDS.new(NOW), body=b"\xff\xfe not text"),
    ]
    conn = _database(tmp_path / "queues.db", memory=memory)
    queue = Queue(conn)
    queue.release([*BATCH, *odd])
    # When a consumer takes some, lets them lapse, and takes them all again
    answers = []
    for now, count in ((NOW + 1, 3), (NOW + 5_000, 10)):
        taken = queue.run(
            now, partial(QueueTxn.receive, queue="orders", max_messages=count, visibility_ms=10)
        )
        answers.append((Deliveries(taken), [Delivery(m, r) for m, r in taken]))
    conn.close()
    # Then each answer is the general path's, byte for byte
    for from_rows, general in answers:
        expected = orjson.dumps({"messages": [d.to_public() for d in general]})
        assert received(from_rows) == expected == received(general)
    again = orjson.loads(received(answers[1][0]))["messages"]
    assert [m["delivery_count"] for m in again] == [2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    assert [m["redelivered"] for m in again] == [True] * 3 + [False] * 7
    assert {m["correlation_id"] for m in again} == {None, "c\n1"}
    assert sum("body_base64" in m for m in again) == 1 and sum(bool(m["headers"]) for m in again)


def test_a_remembered_receipt_no_longer_held_acks_nothing(conn: sqlite3.Connection) -> None:
    queue = Queue(conn)
    queue.release(BATCH[:2])
    old = queue.receive(NOW + 1, 2, visibility_ms=10)
    new = queue.receive(NOW + 100, 1)  # the first one again: its old receipt is over
    assert queue.ack(NOW + 101, [old[0]]) == (0, [old[0]])
    queue.run(NOW + 102, lambda txn: txn.settle("orders", [old[1]], ack=False, requeue=True))
    assert queue.ack(NOW + 103, [old[1]]) == (0, [old[1]])
    assert queue.ack(NOW + 104, new) == (1, [])
    states = [r[0] for r in conn.execute("SELECT state FROM messages ORDER BY seq")]
    assert states == ["acked", "ready"]


def test_a_released_row_in_memory_is_the_row_the_table_holds(conn: sqlite3.Connection) -> None:
    queue = Queue(conn)
    queue.catalog.queues["orders"].args = QueueArgs(message_ttl_ms=30_000)
    queue.catalog.recompute()
    queue.release(BATCH)
    memory = conn.released
    assert memory is not None
    rows = conn.execute(f"{SELECT_SQL.replace(' FROM', ', rowid FROM')} ORDER BY seq").fetchall()
    remembered = [(*memory.get(row[20]), row[-1]) for row in rows if memory.get(row[20])]
    assert len(remembered) == 3  # the plain ones (no headers)
    assert remembered == [row for row in rows if memory.get(row[20])]


def test_a_receive_of_remembered_rows_reads_no_body(conn: sqlite3.Connection) -> None:
    queue = Queue(conn)
    queue.release([m for m in BATCH if not m.headers])
    seen = _statements(conn)
    assert len(queue.receive(NOW + 1, 10)) == 3
    conn.set_trace_callback(None)
    # One read, of the ready rows' key, place and state (and whether any in flight lapsed)
    [read] = [s for s in seen if s.startswith("SELECT")]
    assert (
        "SELECT seq, rowid, state FROM messages WHERE queue = 'orders' AND state = 'ready'" in read
    )
    assert "body" not in read
    assert len(conn.released or ()) == 0


def test_a_receive_and_an_ack_from_memory_tell_the_queue_expiry_a_policy_gave_since(
    conn: sqlite3.Connection,
) -> None:
    queue = Queue(conn)
    queue.release([BATCH[0], BATCH[4]])  # both plain: remembered at their release
    receipts = queue.receive(NOW + 1, 1)
    queue.run(NOW + 2, lambda txn: restamp_expiry(txn.conn, "orders", 60_000))
    assert queue.ack(NOW + 3, receipts) == (1, [])
    (acked,) = [e[1] for e in queue.events if e[0] == "acked"]
    assert acked.queue_expires_at_ms == NOW + 60_000
    ((later, _),) = queue.run(
        NOW + 4, lambda txn: txn.receive("orders", max_messages=1, visibility_ms=10)
    )
    assert later.queue_expires_at_ms == NOW + 60_000


def test_the_ack_finds_its_rows_by_key_not_through_the_in_flight_index(
    conn: sqlite3.Connection,
) -> None:
    """Through the in-flight index the ack would walk every message a consumer holds."""
    queue = Queue(conn)
    receipts = queue.received(3)
    seen = _statements(conn)
    queue.ack(NOW + 2, receipts)
    conn.set_trace_callback(None)
    (update,) = [s for s in seen if s.startswith("UPDATE")]
    plan = " ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {update}"))
    assert "INTEGER PRIMARY KEY" in plan and "messages_held" not in plan


def test_the_memory_forgets_the_oldest_rows_first_and_those_are_still_acked(
    tmp_path: Path,
) -> None:
    conn = _database(tmp_path / "queues.db", memory=False)
    conn.handed_out = RowMemory(max_rows=3, max_body_bytes=1_000)
    queue = Queue(conn)
    receipts = queue.received(5)
    assert len(conn.handed_out) == 3
    assert queue.ack(NOW + 2, receipts) == (5, [])
    assert len(conn.handed_out) == 0
    conn.close()


def test_the_memory_is_bounded_by_body_bytes() -> None:
    memory = RowMemory(max_rows=100, max_body_bytes=10)
    for key in range(4):
        memory.keep(key, (f"r.{key}", (), NOW), 4)
    assert len(memory) == 2
    assert memory.get(0) is None and memory.get(3) == ("r.3", (), NOW)
    memory.keep(3, ("r.again", (), NOW), 4)  # received again: replaces its entry
    assert memory.get(3) == ("r.again", (), NOW) and len(memory) == 2


def test_keeping_and_forgetting_many_rows_leaves_what_one_at_a_time_leaves() -> None:
    """A receive keeps (and an ack forgets) its rows in one call: the same entries, oldest
    forgotten first, whether the bound is the count or the body bytes."""
    rng = random.Random(7)
    batches = [
        [(rng.randrange(30), f"r.{i}.{k}", rng.randrange(6)) for k in range(9)] for i in range(8)
    ]
    for bounds in ({"max_rows": 10}, {"max_body_bytes": 20}):
        one, many = RowMemory(**bounds), RowMemory(**bounds)
        for batch in batches:
            for key, entry, size in batch:
                one.keep(key, entry, size)
            many.keep_many(batch)
            gone = [key for key, _, _ in batch[::3]]
            for key in gone:
                one.forget(key)
            many.forget_many(gone)
            assert [(k, one.get(k)) for k in range(30)] == [(k, many.get(k)) for k in range(30)]
            assert len(one) == len(many)


@pytest.mark.parametrize("seed", range(5))
def test_any_mix_of_queue_work_leaves_the_same_with_the_memories_as_without(
    tmp_path: Path, seed: int
) -> None:
    """Releases (plain messages and others), receives of any size with short visibility
    timeouts (redeliveries), acks with stale, repeated and made-up receipts, requeues and a
    policy's new TTL, in one random order: every result, event and row the same."""
    outcomes = []
    pool = [_message(i) for i in range(1_000)]
    for memory in (False, True):
        rng = random.Random(seed)
        conn = _database(tmp_path / f"{seed}-{memory}.db", memory=memory)
        queue = Queue(conn)
        made = iter(pool)
        held: list[str] = []
        results: list[Any] = []
        now = NOW
        for _ in range(120):
            now += rng.choice((1, 5, 50))
            step = rng.random()
            if step < 0.3:
                queue.release([next(made) for _ in range(rng.randint(1, 8))])
            elif step < 0.6:
                count, visibility = rng.randint(1, 6), rng.choice((20, 100_000))
                receipts = queue.receive(now, count, visibility_ms=visibility)
                held += receipts
                results.append(len(receipts))
            elif step < 0.85 and held:
                chosen = rng.sample(held, rng.randint(1, len(held)))
                chosen += rng.sample(chosen, rng.randint(0, 1)) + ["01ZZ.777"] * rng.randint(0, 1)
                done, unknown = queue.ack(now, chosen)
                results.append((done, [chosen.index(r) for r in unknown]))
            elif step < 0.95 and held:
                chosen = rng.sample(held, 1)
                done, unknown = queue.run(
                    now, lambda txn, c=chosen: txn.settle("orders", c, ack=False, requeue=True)
                )
                results.append((done, len(unknown)))
            else:
                ttl = rng.choice((1_000, 60_000, None))
                queue.run(now, lambda txn, t=ttl: restamp_expiry(txn.conn, "orders", t))
        events = [(e[0], copy.copy(e[1]), e[2]) for e in queue.events]
        rows = conn.execute(f"{_ALL_BUT_RECEIPT} ORDER BY seq").fetchall()
        outcomes.append((results, events, rows))
        conn.close()
    plain, remembered = outcomes
    assert remembered[0] == plain[0]
    assert remembered[1] == plain[1]
    assert remembered[2] == plain[2]


@pytest.mark.parametrize("memory", [False, True], ids=["read", "remembered"])
def test_a_receive_takes_lapsed_in_flight_messages_in_their_old_place(
    tmp_path: Path, memory: bool
) -> None:
    # Given four messages released, the first two received under a short visibility timeout
    conn = _database(tmp_path / "queues.db", memory=memory)
    queue = Queue(conn)
    queue.release(BATCH[:4])
    assert len(queue.receive(NOW + 1, 2, visibility_ms=20)) == 2

    def take(now_ms: int, count: int) -> list[tuple[str, bool, int]]:
        taken = queue.run(
            now_ms, lambda txn: txn.receive("orders", max_messages=count, visibility_ms=1000)
        )
        return [(m.id, m.redelivered, m.delivery_count) for m, _ in taken]

    # While their timeout runs, a receive takes the ready ones only
    assert take(NOW + 5, 1) == [(BATCH[2].id, False, 1)]
    # When it has ended, a receive takes them again first, in queue order, then the ready one
    assert take(NOW + 50, 5) == [
        (BATCH[0].id, True, 2),
        (BATCH[1].id, True, 2),
        (BATCH[3].id, False, 1),
    ]
    # and when more have lapsed than a receive asks for, the first in queue order
    assert take(NOW + 5_000, 2) == [(BATCH[0].id, True, 3), (BATCH[1].id, True, 3)]
    conn.close()
