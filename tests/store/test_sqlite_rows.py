"""The ``messages`` row codec (``store/sqlite/rows.py``) and the batched release insert of
``QueueTxn.flush`` on a real SQLite file."""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tarry.errors import Unavailable
from tarry.model.ids import IdGenerator
from tarry.model.message import Death, DeathReason, Message, Report, Undeliverable
from tarry.model.queue_args import QueueArgs
from tarry.model.state import MessageState
from tarry.queues import release_writes
from tarry.queues import txn as txn_module
from tarry.queues.catalog import Catalog, QueueEntry
from tarry.queues.sequence import Sequencer
from tarry.queues.txn import QueueTxn
from tarry.store.sqlite.database import _connect
from tarry.store.sqlite.rows import SELECT_SQL, Released, from_row, insert_released, to_insert
from tarry.store.sqlite.schema import migrate

NOW = 1_700_000_000_000


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = _connect(str(tmp_path / "queues.db"))
    migrate(conn)
    yield conn
    conn.close()


IDS = IdGenerator()


def _message(message_id: str | None = None, **fields: object) -> Message:
    message = Message(
        id=IDS.new(NOW),
        destination="orders",
        body=b"payload",
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=NOW,
        expires_at_ms=None,
        message_id=message_id,
        updated_at_ms=NOW,
    )
    return replace(message, **fields)  # type: ignore[arg-type]


def _read(conn: sqlite3.Connection, message_id: str) -> Message:
    return from_row(conn.execute(f"{SELECT_SQL} WHERE id = ?", (message_id,)).fetchone())


def test_a_row_with_every_column_set_round_trips(conn: sqlite3.Connection) -> None:
    message = _message(
        "m-1",
        topic="events",
        headers={"k": "v"},
        correlation_id="c-1",
        reply_to="replies",
        report=frozenset({Report.EXPIRATION, Report.EXCEPTION}),
        on_undeliverable=Undeliverable.DISCARD,
        persistent=False,
        failures=2,
        last_error="timeout: no answer",
        state=MessageState.DELIVERED,
        queue="orders",
        enqueued_at_ms=NOW + 1,
        queue_expires_at_ms=NOW + 2,
        redelivered=True,
        delivery_count=3,
        sent_at_ms=NOW - 1,
        deliver_at_ms=NOW + 3,
        updated_at_ms=NOW + 4,
    )
    message.expires_at_ms = NOW + 5
    conn.execute(*to_insert(message, seq=7, receipt="r-1", visible_at_ms=NOW + 9))
    assert _read(conn, message.id) == message
    assert conn.execute(
        "SELECT seq, receipt, visible_at_ms, dedupe_key FROM messages WHERE id = ?",
        (message.id,),
    ).fetchone() == (7, "r-1", NOW + 9, "events\x1forders\x1fm-1")
    # A copy tarry made itself (it has deaths) carries no de-duplication key.
    copy = replace(message, id=IDS.new(NOW), deaths=[Death(DeathReason.EXPIRED, "a", NOW, 1, "a")])
    conn.execute(*to_insert(copy))
    assert _read(conn, copy.id) == copy


def test_a_row_leaving_its_optional_columns_out_reads_back_as_null_or_default(
    conn: sqlite3.Connection,
) -> None:
    message = _message(body=b"")
    conn.execute(*to_insert(message))
    assert _read(conn, message.id) == message
    row = conn.execute(
        "SELECT typeof(body), report, failures, seq, receipt, dedupe_key, deaths "
        "FROM messages WHERE id = ?",
        (message.id,),
    ).fetchone()
    assert row == ("blob", "", 0, None, None, None, None)


def _txn(conn: sqlite3.Connection) -> QueueTxn:
    catalog = Catalog()
    catalog.queues["orders"] = QueueEntry("orders", QueueArgs(), NOW, NOW)
    catalog.recompute()
    return QueueTxn(
        conn,
        now_ms=NOW,
        catalog=catalog,
        ids=IdGenerator(),
        seq=Sequencer(),
        waiting={},
        error_queue="tarry.errors",
    )


def test_a_key_held_by_an_older_message_mid_batch_keeps_every_released_message(
    conn: sqlite3.Connection,
) -> None:
    """A producer reused a message_id whose older message is still kept (finished): the batch
    is written row by row, the newcomer without the key, nothing lost or doubled."""
    older = _message("dup", state=MessageState.ACKED)
    conn.execute(*to_insert(older))
    batch = [_message("a"), _message("dup"), _message(None)]
    conn.execute("BEGIN")
    txn = _txn(conn)
    for message in batch:
        txn.enqueue(message, "orders", insert=True)
    txn.flush()
    conn.execute("COMMIT")
    rows = conn.execute(
        "SELECT id, state, seq, dedupe_key FROM messages WHERE queue = 'orders' ORDER BY seq"
    ).fetchall()
    assert rows == [
        (batch[0].id, "ready", 1, "\x1forders\x1fa"),
        (batch[1].id, "ready", 2, None),
        (batch[2].id, "ready", 3, None),
    ]
    assert conn.execute("SELECT dedupe_key FROM messages WHERE id = ?", (older.id,)).fetchone() == (
        "\x1forders\x1fdup",
    )
    assert [e[0] for e in txn.events] == ["released"] * 3


def _plain_batch() -> list[Message]:
    return [_message(body=bytes([i])) for i in range(6)]


def _mixed_batch() -> list[Message]:
    """Plain messages and every kind the column-wise path hands to ``enqueue``."""
    batch = [_message(body=bytes([i])) for i in range(6)]
    batch[1].expires_at_ms = NOW + 60_000
    batch[2].headers = {"k": "v"}
    batch[3] = replace(batch[3], message_id="m-3", failures=1, last_error="x: y")
    batch[4].expires_at_ms = NOW  # expired on arrival: dead-lettered, never ready
    return batch


@pytest.mark.parametrize(
    "args",
    [QueueArgs(), QueueArgs(message_ttl_ms=5_000), QueueArgs(max_length=3)],
    ids=["plain", "ttl", "max-length"],
)
@pytest.mark.parametrize("keyed", [False, True], ids=["id", "key"])
def test_enqueue_many_writes_what_enqueue_writes_message_by_message(
    tmp_path: Path, args: QueueArgs, keyed: bool
) -> None:
    """The column-wise release (``enqueue_many``: plain rows bound column by column, the rest
    through ``enqueue``) leaves the same rows, events and messages as ``enqueue`` one by one."""
    results = []
    made = _mixed_batch()
    for way in ("one by one", "many"):
        conn = _connect(str(tmp_path / f"{way}-{keyed}.db"))
        migrate(conn, queues_only=keyed)
        txn = _txn(conn)
        txn.catalog.queues["orders"].args = args
        txn.catalog.queues["dead"] = QueueEntry("dead", QueueArgs(), NOW, NOW)
        txn.catalog.recompute()
        batch = copy.deepcopy(made)
        conn.execute("BEGIN")
        if way == "many":
            assert txn.enqueue_many(batch, "orders") == []
        else:
            for message in batch:
                txn.enqueue(message, "orders", insert=True)
        txn.flush()
        conn.execute("COMMIT")
        rows = conn.execute("SELECT * FROM messages ORDER BY seq, id").fetchall()
        results.append((rows, txn.events, batch, txn.filled))
        conn.close()
    for one, many in zip(*results, strict=True):
        assert one == many
    rows = results[1][0]
    assert len(rows) == 6
    if args.max_length is None:
        assert sum(1 for row in rows if "ready" in row) == 5


def test_enqueue_many_refuses_every_message_for_a_queue_that_is_gone(
    conn: sqlite3.Connection,
) -> None:
    txn = _txn(conn)
    batch = [_message(), _message()]
    conn.execute("BEGIN")
    refused = txn.enqueue_many(batch, "missing")
    txn.flush()
    conn.execute("COMMIT")
    assert [(m.id, e.reason) for m, e in refused] == [(m.id, "unknown_destination") for m in batch]
    assert conn.execute("SELECT count(*) FROM messages").fetchone() == (0,)
    assert txn.events == []


@pytest.mark.parametrize(
    "args", [QueueArgs(), QueueArgs(max_length=10)], ids=["column-wise", "one-by-one"]
)
@pytest.mark.parametrize("keyed", [False, True], ids=["id", "key"])
@pytest.mark.parametrize("batch", [_mixed_batch, _plain_batch], ids=["mixed", "plain"])
def test_enqueue_many_leaves_messages_released_before_as_they_are(
    tmp_path: Path, args: QueueArgs, keyed: bool, batch: Callable[[], list[Message]]
) -> None:
    """A batch released again after a crash that came ahead of the store's markers, with new
    messages among those already here (plain and not): the ones here keep their rows (not
    written twice, not moved) and get no event; the new ones are written as usual. Plain
    messages alone are written column-wise without a savepoint (what the INSERT left out is
    found by its ``seq``)."""
    conn = _connect(str(tmp_path / "queues.db"))
    migrate(conn, queues_only=keyed)
    txn = _txn(conn)
    txn.catalog.queues["orders"].args = args
    txn.catalog.recompute()
    made = batch()
    conn.execute("BEGIN")
    assert txn.enqueue_many(copy.deepcopy(made[::2]), "orders") == []
    txn.flush()
    conn.execute("COMMIT")
    first = {row[0]: row for row in conn.execute("SELECT * FROM messages")}
    # When the whole batch, in order, is released in a later transaction
    again = _txn(conn)
    again.seq.value = txn.seq.value
    again.catalog.queues["orders"].args = args
    again.catalog.recompute()
    conn.execute("BEGIN")
    assert again.enqueue_many(copy.deepcopy(made), "orders") == []
    again.flush()
    conn.execute("COMMIT")
    # Then every message has one row; the earlier ones are as they were
    rows = {row[0]: row for row in conn.execute("SELECT * FROM messages")}
    assert sorted(rows) == sorted(m.id for m in made)
    assert all(rows[i] == row for i, row in first.items())
    told = [(kind, m.id) for kind, m, *_ in again.events]
    assert {i for _, i in told} == {m.id for m in made[1::2]}
    assert ("released", made[1].id) in told
    conn.close()


def test_a_row_taken_yet_not_seen_fails_the_release_instead_of_looping(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The INSERT finds an id taken that the look-up does not see (another node's row, on
    PostgreSQL): the release fails, to be tried again, rather than writing forever."""
    message = _message()
    txn = _txn(conn)
    conn.execute("BEGIN")
    txn.enqueue_many([copy.deepcopy(message)], "orders")
    txn.flush()
    conn.execute("COMMIT")
    again = _txn(conn)
    # Neither the look-up nor the check after the INSERT sees the row.
    for module in (txn_module, release_writes):
        monkeypatch.setattr(module, "seqs_of", lambda conn, ids: iter(()))
    conn.execute("BEGIN")
    again.enqueue_many([copy.deepcopy(message)], "orders")
    with pytest.raises(Unavailable):
        again.flush()
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT count(*) FROM messages").fetchone() == (1,)


@pytest.mark.parametrize(
    ("count", "statements"), [(1, 1), (3, 1), (15, 1), (16, 1), (23, 2), (40, 2), (300, 3)]
)
def test_insert_released_writes_a_small_round_in_one_statement(
    tmp_path: Path, count: int, statements: int
) -> None:
    """A round's few rows (and a batch's rest below ``EXACT_ROWS_BELOW``) go in one INSERT of
    exactly their count; the rows are those written one at a time, and a taken id is still
    skipped and left out of the count."""
    rows: list[Released] = [
        (IDS.new(NOW), bytes([i % 256]), NOW, NOW + i, i, NOW + 60_000, None, None, None, None)
        for i in range(count)
    ]
    tables = []
    for way in ("one at a time", "at once"):
        conn = _connect(str(tmp_path / f"{way}.db"))
        migrate(conn)
        inserts: list[str] = []
        conn.set_trace_callback(inserts.append)
        if way == "at once":
            written = insert_released(conn, queue="orders", now_ms=NOW, rows=rows)
        else:
            written = sum(
                insert_released(conn, queue="orders", now_ms=NOW, rows=[row]) for row in rows
            )
        assert written == count
        if way == "at once":
            assert sum(sql.startswith("INSERT") for sql in inserts) == statements
            assert insert_released(conn, queue="orders", now_ms=NOW, rows=rows[:3]) == 0
        tables.append(conn.execute("SELECT * FROM messages ORDER BY id").fetchall())
        conn.close()
    assert tables[0] == tables[1]
    assert len(tables[0]) == count


@pytest.mark.parametrize("delivered_before", [0, 2])
def test_a_row_read_as_delivered_is_what_a_receives_update_leaves(
    conn: sqlite3.Connection, delivered_before: int
) -> None:
    # Given a queued message's row, delivered before or not
    message = _message(state=MessageState.READY, queue="orders", delivery_count=delivered_before)
    conn.execute(*to_insert(message))
    row = conn.execute(f"{SELECT_SQL} WHERE id = ?", (message.id,)).fetchone()
    # When it is read as a receive at NOW + 5 leaves it, and that receive's UPDATE is run
    delivered = from_row(row, delivered_at_ms=NOW + 5)
    conn.execute(
        "UPDATE messages SET state = 'delivered', delivery_count = delivery_count + 1, "
        "redelivered = CASE WHEN redelivered <> 0 OR delivery_count > 0 THEN 1 ELSE 0 END, "
        "updated_at_ms = ? WHERE id = ?",
        (NOW + 5, message.id),
    )
    # Then both say the same
    assert delivered == _read(conn, message.id)
    assert delivered.redelivered is (delivered_before > 0)
    assert delivered.delivery_count == delivered_before + 1
