"""The messages of a queue a consumer may take, read for a receive: ready ones, and in-flight
ones whose visibility timeout ended, in queue order.

On SQLite one statement finds the ready ones and whether any in-flight one may be taken again
(usually none: a statement of their own cost a receive about as much as finding the ready ones,
so it is run only then). Each row then comes from the connection's memory of the rows releases
wrote (``store/sqlite/row_memory.py``) where it holds that row, so that a receive reads only the
key, place and state of each row the usual way (a message received within moments of its
release), and every column of the others. PostgreSQL locks the rows it reads (``FOR UPDATE
SKIP LOCKED``, which a compound statement cannot take): there each state is read on its own,
every column."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from typing import Any

from tarry.store.sql import QueueConnection, in_list, row_key, row_lock
from tarry.store.sqlite.rows import COLUMNS

__all__ = ["takeable_rows"]

_ALL = ", ".join(COLUMNS)
_SEQ = COLUMNS.index("seq")


def takeable_rows(
    conn: QueueConnection,
    ready: str,
    held: str,
    args: Sequence[Any],
    limit: int,
    *,
    skip: Collection[int] = (),
) -> tuple[list[Any], bool]:
    """The first ``limit`` rows, by ``seq``, that ``ready`` (a condition on ready messages) or
    ``held`` (on in-flight ones) finds, each condition taking ``args``: ``SELECT_SQL``'s
    columns, then the row key; on PostgreSQL the rows are locked, skipping locked ones.
    ``skip``: keys of ready rows to step over (claimed by a receive not yet written, SQLite
    only: ``store/sqlite/pending_receives.py``). Also whether more rows may be takeable: on
    SQLite exactly (the look at the places reads one more), on PostgreSQL whenever ``limit``
    rows were found (reading one more there would lock it)."""
    if row_key(conn) != "rowid":
        lock = row_lock(conn, skip_locked=True)
        found = [
            conn.execute(
                f"SELECT {_ALL}, {row_key(conn)} FROM messages WHERE {where} "
                f"ORDER BY seq LIMIT ?{lock}",
                [*args, limit],
            ).fetchall()
            for where in (ready, held)
        ]
        locked = list(heapq.merge(*found, key=lambda row: row[_SEQ]))[:limit]
        return locked, len(locked) == limit
    # The ready rows, and whether any in-flight one may be taken again (its own read, then).
    found = conn.execute(
        f"SELECT * FROM (SELECT seq, rowid, state FROM messages WHERE {ready} ORDER BY seq "
        f"LIMIT ?) UNION ALL SELECT NULL, NULL, NULL WHERE EXISTS (SELECT 1 FROM messages "
        f"WHERE {held})",
        [*args, limit + len(skip) + 1, *args],
    ).fetchall()
    places = [place for place in found if place[0] is not None]
    held_too = len(places) < len(found)
    if skip:
        places = [place for place in places if place[1] not in skip]
    if held_too:
        returned = conn.execute(
            f"SELECT seq, rowid, state FROM messages WHERE {held} ORDER BY seq LIMIT ?",
            [*args, limit + 1],
        ).fetchall()
        places = list(heapq.merge(places, returned))
    more = len(places) > limit
    del places[limit:]
    memory = conn.released
    rows: list[Any] = []
    missing: list[int] = []
    for seq, key, state in places:
        # The memory holds rows as their release wrote them: ready ones only.
        entry = memory.get(seq) if memory is not None and state == "ready" else None
        if entry is None:
            missing.append(key)
        rows.append(None if entry is None else (*entry, key))
    if missing:
        where_keys, keys = in_list(conn, "rowid", missing)
        read = {
            row[-1]: row
            for row in conn.execute(f"SELECT {_ALL}, rowid FROM messages WHERE {where_keys}", keys)
        }
        rows = [
            read[key] if row is None else row for row, (_, key, _) in zip(rows, places, strict=True)
        ]
    return rows, more
