"""A queue's ready messages a consumer may take, read for a receive: from the connection's
memory of the rows releases wrote (``store/sqlite/row_memory.py``) where it holds them, so that
a receive reads only the key and place of each row the usual way (a message received within
moments of its release), and every column of the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tarry.store.sql import QueueConnection, in_list, row_key
from tarry.store.sqlite.rows import COLUMNS

__all__ = ["ready_rows"]

_ALL = ", ".join(COLUMNS)


def ready_rows(conn: QueueConnection, where: str, args: Sequence[Any], order: str) -> list[Any]:
    """The rows ``where`` finds (``SELECT_SQL``'s columns, then the row key), in ``order``
    (``ORDER BY ... LIMIT ...`` and any lock clause, its parameters last in ``args``)."""
    memory = conn.released
    if memory is None:  # PostgreSQL, or a connection that keeps none
        sql = f"SELECT {_ALL}, {row_key(conn)} FROM messages WHERE {where} {order}"
        return list(conn.execute(sql, args).fetchall())
    found = conn.execute(f"SELECT seq, rowid FROM messages WHERE {where} {order}", args).fetchall()
    rows: list[Any] = []
    missing: list[int] = []
    for seq, key in found:
        entry = memory.get(seq)
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
            read[key] if row is None else row for row, (_, key) in zip(rows, found, strict=True)
        ]
    return rows
