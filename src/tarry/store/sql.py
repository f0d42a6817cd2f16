"""The connection face shared SQL runs against (``sqlite3.Connection``, or PostgreSQL through
``store/postgres/dialect.py``), and the differences that SQL must state itself: locking the
rows a SELECT returns against other nodes' transactions, the column that finds a row by id, and
a list of values to match (``in_list``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from tarry.store.sqlite.pending_receives import PendingReceives
    from tarry.store.sqlite.row_memory import RowMemory

__all__ = [
    "ACKED",
    "COUNT_DELIVERY",
    "RECEIPT_SQL",
    "QueueConnection",
    "SqlConnection",
    "SqlCursor",
    "id_column",
    "id_key",
    "in_list",
    "received_sql",
    "row_key",
    "row_lock",
]


#: The SQL of a row's receipt, ``?`` being the receive's id and ``{key}`` ``row_key``; the same
#: text as ``tarry.queues.receipts.receipt_of``.
RECEIPT_SQL = "CAST(? AS TEXT) || '.' || {key}"
#: What a delivery counts on its row (a receive's UPDATE, and an ack of a receive that was not
#: written, ``store/sqlite/pending_receives.py``): both must leave the same row.
COUNT_DELIVERY = (
    "delivery_count = delivery_count + 1, "
    "redelivered = CASE WHEN redelivered <> 0 OR delivery_count > 0 THEN 1 ELSE 0 END"
)


#: What an ack sets on its row (the body is no longer needed once the message is finished).
ACKED = "state = 'acked', body = NULL, receipt = NULL"


def received_sql(key: str, where: str) -> str:
    """A receive's write of the rows ``where`` finds (``key``: ``row_key``), its parameters the
    receive's id, the end of the visibility timeout and the time, then ``where``'s: the same
    statement whether the receive writes at once or its claim is written later
    (``store/sqlite/pending_receives.py``)."""
    return (
        f"UPDATE messages SET state = 'delivered', receipt = {RECEIPT_SQL.format(key=key)}, "
        f"visible_at_ms = ?, {COUNT_DELIVERY}, updated_at_ms = ? WHERE {where}"
    )


class SqlCursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class SqlConnection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any: ...


class QueueConnection(SqlConnection, Protocol):
    """The connection a queue transaction (``tarry.queues.txn``) runs on: SQLite's queue
    database (``store/sqlite/database.Connection``) or PostgreSQL (``PgConnection``), with what
    it remembers of rows lately written or read (``store/sqlite/row_memory.py``)."""

    @property
    def released(self) -> RowMemory | None:
        """The rows releases wrote, by ``seq`` (a queue database of its own); None where the
        connection keeps none."""

    @property
    def handed_out(self) -> RowMemory | None:
        """The rows receives handed out, by row key; None where the connection keeps none."""

    @property
    def pending_receives(self) -> PendingReceives | None:
        """Receives whose rows are not written yet (a queue database of its own); None where
        every receive writes its rows at once."""


def row_lock(conn: object, *, skip_locked: bool = False) -> str:
    """The clause that makes a SELECT lock its rows until the transaction ends (with
    ``skip_locked``, rows another transaction holds are left out). Empty for SQLite, where one
    process owns the database and every write transaction is exclusive."""
    dialect = getattr(conn, "dialect", None)
    return "" if dialect is None else str(dialect.row_lock(skip_locked=skip_locked))


def row_key(conn: object) -> str:
    """The column that names a row within one statement (``... WHERE k IN (SELECT k ...)``):
    SQLite's ``rowid`` (no index look-up), PostgreSQL's ``id``."""
    dialect = getattr(conn, "dialect", None)
    return "rowid" if dialect is None else str(dialect.row_key)


def id_column(conn: object) -> str:
    """The column a lookup by id matches: ``key`` where the table is keyed in release order (a
    queue database of its own, ``tarry.store.sqlite.schema``), its values made by ``id_key``;
    else ``id`` itself (and ``id_key`` leaves ids as they are)."""
    return "key" if getattr(conn, "keyed", False) else "id"


def id_key(conn: object, message_id: str) -> str:
    """The value ``id_column`` holds for ``message_id`` (the SQL of the ``key`` column)."""
    if getattr(conn, "keyed", False):
        return message_id[10:] + message_id[:10]
    return message_id


def in_list(conn: object, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """The condition ``column`` is one of ``values`` (ints or strings), and its parameters. On
    SQLite the list is one JSON parameter read by ``json_each``: the statement's text is the same
    for every length, so it stays in the connection's cache of prepared statements (a consumer's
    receives and acks come in more sizes than the cache holds). PostgreSQL gets placeholders."""
    if getattr(conn, "dialect", None) is None:
        return f"{column} IN (SELECT value FROM json_each(?))", [orjson.dumps(values).decode()]
    return f"{column} IN ({', '.join('?' * len(values))})", list(values)
