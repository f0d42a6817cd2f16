"""Run the engine's SQL, written once for SQLite (``?`` placeholders), on a psycopg connection.

The queue rules (``queues/txn.py``), the catalog and the send path are synchronous code over a
DB-API-like connection. ``PgConnection`` gives them the same face on PostgreSQL: ``?`` and
``?N`` placeholders become psycopg's ``%s``, and ``dialect.row_lock`` says how to lock the rows
a SELECT returns against other nodes (SQLite has one writer, so there it is empty).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from tarry.store.sqlite.pending_receives import PendingReceives
    from tarry.store.sqlite.row_memory import RowMemory

__all__ = ["PgConnection", "PgDialect", "translate"]

_PLACEHOLDER = re.compile(r"\?(\d*)|%")


@lru_cache(maxsize=512)
def translate(sql: str) -> tuple[str, tuple[int, ...] | None]:
    """``?`` → ``%s`` (and ``%`` → ``%%``); ``?N`` → ``%s`` with the parameter order to pass
    (None: as given)."""
    order: list[int] = []
    numbered = False

    def replace(match: re.Match[str]) -> str:
        nonlocal numbered
        if match.group(0) == "%":
            return "%%"
        if match.group(1):
            numbered = True
            order.append(int(match.group(1)) - 1)
        else:
            order.append(len(order))
        return "%s"

    text = _PLACEHOLDER.sub(replace, sql)
    if not order:  # psycopg leaves a query without parameters as it is: keep its % signs
        return sql, None
    return text, (tuple(order) if numbered else None)


def _params(order: tuple[int, ...] | None, params: Sequence[Any]) -> Sequence[Any]:
    return params if order is None else [params[i] for i in order]


class PgDialect:
    """How PostgreSQL differs for the shared SQL."""

    name = "postgres"
    #: The column that names a row within one statement (``tarry.store.sql.row_key``).
    row_key = "id"

    @staticmethod
    def row_lock(*, skip_locked: bool) -> str:
        return " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"


class PgConnection:
    """A psycopg connection inside a transaction, with the sqlite3 calling convention."""

    dialect = PgDialect()
    #: No memory of rows (``tarry.store.sql.QueueConnection``): several nodes may write the
    #: same rows, so each is read from the table, and each receive is written at once.
    released: RowMemory | None = None
    handed_out: RowMemory | None = None
    pending_receives: PendingReceives | None = None

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        text, order = translate(sql)
        return self.raw.execute(text.encode(), _params(order, parameters) or None)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> psycopg.Cursor[Any]:
        text, order = translate(sql)
        cursor = self.raw.cursor()
        cursor.executemany(text.encode(), [_params(order, r) for r in rows])
        return cursor
