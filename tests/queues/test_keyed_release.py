"""Releasing messages an idempotent producer sent (each with a ``message_id``) into a local
queue by the column-wise INSERT (``insert_released``): each row keeps its ``message_id`` and its
de-duplication key, and a message whose key an older finished message still holds (the
producer used the ``message_id`` again after the older one's partition was gone) is released
all the same, without the key, as the row-by-row write keeps it (``write_row``)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from tests.queues.test_row_memory import IDS, NOW, Queue, _database

from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.sqlite.rows import SELECT_SQL, from_row, to_insert


def _keyed(i: int, *, headers: bool = False) -> Message:
    return Message(
        id=IDS.new(NOW),
        destination="orders",
        body=b"body %d" % i,
        headers={"n": str(i)} if headers else {},
        sent_at_ms=NOW - 10,
        deliver_at_ms=NOW,
        expires_at_ms=None,
        message_id=f"order-{i}",
        updated_at_ms=NOW,
    )


def _rows(conn: sqlite3.Connection) -> dict[str, tuple[str | None, str | None, str]]:
    """(message_id, dedupe_key, state) of each row, by id."""
    return {
        row[0]: (row[1], row[2], row[3])
        for row in conn.execute("SELECT id, message_id, dedupe_key, state FROM messages")
    }


def test_keyed_rows_keep_their_message_id_and_key(tmp_path: Path) -> None:
    # Given a queue and messages sent with a message_id each
    conn = _database(tmp_path / "q.db", memory=True)
    queue = Queue(conn)
    batch = [_keyed(i) for i in range(3)]
    # When they are released
    queue.release(batch)
    # Then each row holds its message_id and the key a repeat is refused by
    assert _rows(conn) == {
        m.id: (m.message_id, f"\x1forders\x1f{m.message_id}", "ready") for m in batch
    }
    # and the memory of released rows is the rows the table holds
    assert conn.released is not None
    for row in conn.execute(f"{SELECT_SQL} ORDER BY seq"):
        assert conn.released.get(row[20]) == tuple(row)
    # and the events tell the message ids
    assert [e[1].message_id for e in queue.events] == ["order-0", "order-1", "order-2"]


def test_a_keyed_row_written_column_wise_is_the_row_written_whole(tmp_path: Path) -> None:
    # Given the same keyed messages (one expiring, one with a correlation id too) and one with
    # a correlation id alone, released into two queue databases
    batch = [_keyed(i) for i in range(4)]
    batch[2] = replace(batch[2], expires_at_ms=NOW + 60_000)
    batch[3] = replace(batch[3], correlation_id="saga-3")
    batch.append(replace(_keyed(4), message_id=None, correlation_id="saga-4"))
    tables = []
    for way in ("column-wise", "whole"):
        conn = _database(tmp_path / f"{way}.db", memory=False)
        queue = Queue(conn)
        # When one writes them column-wise (enqueue_many) and the other each whole, as
        # keyed messages were written before (enqueue(insert=True): to_insert's row)
        if way == "column-wise":
            queue.release(batch)
        else:
            queue.run(
                NOW,
                lambda txn: [txn.enqueue(replace(m), "orders", insert=True) for m in batch],
            )
        tables.append(conn.execute(f"{SELECT_SQL} ORDER BY seq").fetchall())
        conn.close()
    # Then the rows are the same, column for column
    assert tables[0] == tables[1]
    assert len(tables[0]) == len(batch)


@pytest.mark.parametrize("with_general_rows", [False, True])
def test_a_key_an_older_finished_message_holds_leaves_the_new_message_without_it(
    tmp_path: Path, with_general_rows: bool
) -> None:
    # Given an older finished message that holds the key of "order-1" in the queue database
    conn = _database(tmp_path / "q.db", memory=True)
    queue = Queue(conn)
    older = replace(_keyed(1), state=MessageState.ACKED, queue="orders")
    conn.execute(*to_insert(older))
    # and new messages, one of them sent again with "order-1" (and, in one case, one with
    # headers, which is written row by row beside the column-wise ones)
    batch = [_keyed(i) for i in range(3)]
    if with_general_rows:
        batch.append(_keyed(3, headers=True))
    # When they are released
    queue.release(batch)
    # Then every new message is in the queue, in its order
    rows = _rows(conn)
    assert [m.id for m in queue_order(conn)] == [m.id for m in batch]
    # the one sent again without the key, which the older one keeps
    again = batch[1]
    assert rows[again.id] == ("order-1", None, "ready")
    assert rows[older.id] == ("order-1", "\x1forders\x1forder-1", "acked")
    # the others with theirs
    assert rows[batch[0].id][1] == "\x1forders\x1forder-0"
    # and each was told released once
    assert sorted(e[1].id for e in queue.events if e[0] == "released") == sorted(
        m.id for m in batch
    )
    # and the memory of released rows is the rows the table holds
    assert conn.released is not None
    for row in conn.execute(f"{SELECT_SQL} WHERE state = 'ready'"):
        remembered = conn.released.get(row[20])
        assert remembered is None or remembered == tuple(row)


def queue_order(conn: sqlite3.Connection) -> list[Message]:
    return [
        from_row(row) for row in conn.execute(f"{SELECT_SQL} WHERE state = 'ready' ORDER BY seq")
    ]
