"""Writing the rows a queue transaction's releases gathered (``QueueTxn.flush``): the general
rows with multi-row INSERTs, the plain ones column-wise (``insert_released``), and what a
plain INSERT left out because its id was here already (released before a crash that came
ahead of the store's marker) found by ``seq`` afterwards, not looked up before.

Separate queue database only (the log store, the memory store): a released message's row is
keyed by its tarry id, which is what makes a release again after a crash a no-op."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence

from tarry.errors import Unavailable
from tarry.model.message import Message
from tarry.store.sql import QueueConnection, id_column, id_key, in_list
from tarry.store.sqlite.rows import (
    RELEASED_KEY,
    Insert,
    Released,
    insert_released,
    insert_rows,
    kept_by_dedupe_key,
    released_row,
    to_insert,
)

__all__ = [
    "Gathered",
    "Plain",
    "keys_held_elsewhere",
    "left_out_why",
    "only",
    "remember",
    "seqs_of",
    "taken_before",
    "unkeyed",
    "without",
    "write_gathered",
    "write_plain",
    "write_plain_rows",
    "write_row",
]

#: Rows ``QueueTxn.enqueue(insert=True)`` gathered: (message, seq, insert).
Gathered = list[tuple[Message, int, Insert]]
#: Plain rows (``insert_released``) gathered, by queue.
Plain = dict[str, list[Released]]


def seqs_of(conn: QueueConnection, message_ids: Sequence[str]) -> Iterator[tuple[str, int]]:
    """(id, seq) of each of these messages that is here."""
    column = id_column(conn)
    for start in range(0, len(message_ids), 900):
        chunk = [id_key(conn, i) for i in message_ids[start : start + 900]]
        where, args = in_list(conn, column, chunk)
        yield from conn.execute(f"SELECT id, seq FROM messages WHERE {where}", args)


def write_row(
    conn: QueueConnection,
    message: Message,
    insert: Insert,
    *,
    seq: int | None,
    visible_at_ms: int | None,
) -> None:
    """Write one message's row (``to_insert``)."""
    try:
        conn.execute(*insert)
    except sqlite3.IntegrityError:
        # Its (destination, message_id) key is held by an older finished message that the
        # producer reused after retention: keep this one too, without the key.
        conn.execute(*to_insert(message, seq=seq, visible_at_ms=visible_at_ms, dedupe=False))


def write_plain(conn: QueueConnection, plain: Plain, now_ms: int) -> bool:
    """The plain rows, column-wise; False when some row was not written, its id being here
    already."""
    gathered = written = 0
    for queue, rows in plain.items():
        gathered += len(rows)
        written += insert_released(conn, queue=queue, now_ms=now_ms, rows=rows)
    return written == gathered


def write_gathered(conn: QueueConnection, rows: Gathered, plain: Plain, now_ms: int) -> bool:
    """``rows`` with multi-row INSERTs (``insert_rows``; a key conflict undoes them alone, back
    to the caller's savepoint ``flush``, and they are written row by row), then the plain rows
    column-wise. False when some plain row was not written, its id being here already."""
    try:
        insert_rows(conn, [insert for _, _, insert in rows])
    except sqlite3.IntegrityError:
        conn.execute("ROLLBACK TO flush")
        for message, seq, insert in rows:
            write_row(conn, message, insert, seq=seq, visible_at_ms=now_ms)
    return write_plain(conn, plain, now_ms)


def taken_before(conn: QueueConnection, plain: Plain) -> set[str]:
    """After a plain INSERT that left some rows out: the ids whose row holds another ``seq``
    than the one given here (written before, not by this flush)."""
    given = {row[0]: row[4] for rows in plain.values() for row in rows}
    return {i for i, seq in seqs_of(conn, list(given)) if given[i] != seq}


def without(plain: Plain, before: set[str]) -> Plain:
    """``plain`` without the rows of the messages released before."""
    return {q: [r for r in rows if r[0] not in before] for q, rows in plain.items()}


def keys_held_elsewhere(conn: QueueConnection, plain: Plain) -> set[str]:
    """The ids of ``plain``'s rows whose de-duplication key a row of another message holds (an
    older finished one whose ``message_id`` the producer used again after its retention):
    their INSERT left them out."""
    ours = {
        row[RELEASED_KEY]: row[0]
        for rows in plain.values()
        for row in rows
        if row[RELEASED_KEY] is not None
    }
    kept = kept_by_dedupe_key(conn, ours)
    return {ours[key] for key, message in kept.items() if message.id != ours[key]}


def unkeyed(plain: Plain, ids: set[str]) -> Plain:
    """``plain`` with the rows of ``ids`` written without their key (keeping their
    ``message_id``), as ``write_row`` keeps such a message."""
    if not ids:
        return plain
    return {q: [_without_key(r) if r[0] in ids else r for r in rows] for q, rows in plain.items()}


def _without_key(row: Released) -> Released:
    return (*row[:RELEASED_KEY], None, *row[RELEASED_KEY + 1 :])  # type: ignore[return-value]


def only(plain: Plain, ids: set[str]) -> Plain:
    """The rows of ``plain`` of the messages of ``ids``."""
    return {q: [r for r in rows if r[0] in ids] for q, rows in plain.items()}


def left_out_why(before: set[str], held: set[str]) -> None:
    """After a write that left rows out: some were released before (``before``) or their key
    is held (``held``); neither means a row is being written elsewhere (another node, on
    PostgreSQL), and the release waits for another round."""
    if not before and not held:
        raise Unavailable(_ELSEWHERE)


_ELSEWHERE = "a released message's row is being written elsewhere"


def write_plain_rows(conn: QueueConnection, plain: Plain, now_ms: int) -> tuple[Plain, set[str]]:
    """Write the plain rows column-wise: ``plain`` as written (a row whose key another message
    holds written again without it) and the ids of those left out, released before."""
    if write_plain(conn, plain, now_ms):
        return plain, set()
    before, held = taken_before(conn, plain), keys_held_elsewhere(conn, plain)
    left_out_why(before, held)
    plain = unkeyed(plain, held)
    if held and not write_plain(conn, only(plain, held), now_ms):
        raise Unavailable(_ELSEWHERE)  # written since, without its key, by another node
    return plain, before


def remember(conn: QueueConnection, plain: Plain, now_ms: int) -> None:
    """The connection's memory of released rows (``RowMemory``) keeps what was written."""
    if (memory := conn.released) is not None:
        keep = memory.keep
        for queue, rows in plain.items():
            for row in rows:
                keep(row[4], released_row(queue, now_ms, row), len(row[1]))
