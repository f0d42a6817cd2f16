"""Receipts: what a consumer acks or nacks a received message with.

A receipt is ``<id>.<row key>``: one new id per receive (``QueueTxn.receive``), then the key of
the message's row (SQLite's ``rowid``, PostgreSQL's ``id``; ``tarry.store.sql.row_key``). The
row's ``receipt`` column holds it while the message is in flight, so a receipt counts only as
long as its row still holds it: a later delivery of the same message has another receipt, and a
reused ``rowid`` another row's. An ack finds its rows by key, without the receipt index; a
receipt not of this form (made before it, still in flight) is found through that index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tarry.model.message import Message
from tarry.store.sql import SqlConnection, in_list, row_key, row_lock
from tarry.store.sqlite.rows import COLUMNS, from_row

__all__ = ["RECEIPT_SQL", "held_by_receipt", "receipt_of"]

#: The SQL of a row's receipt, ``?`` being the receive's id and ``{key}`` ``row_key``; the same
#: text as ``receipt_of``.
RECEIPT_SQL = "CAST(? AS TEXT) || '.' || {key}"

_ALL = ", ".join(COLUMNS)
_QUEUE = COLUMNS.index("queue")
_STATE = COLUMNS.index("state")
_RECEIPT = COLUMNS.index("receipt")
#: The largest ``rowid`` SQLite gives a row.
_LAST_ROWID = 2**63 - 1
#: Values per look-up statement (well under SQLite's bound on parameters).
_CHUNK = 500


def receipt_of(receive_id: str, key: object) -> str:
    """The receipt ``RECEIPT_SQL`` gives the row of ``key`` (an int or an id) in a receive."""
    return f"{receive_id}.{key}"


def held_by_receipt(
    conn: SqlConnection, queue: str, receipts: Sequence[str]
) -> dict[str, tuple[Any, Message]]:
    """The messages of ``queue`` in flight under ``receipts``, their rows locked, by receipt:
    (row key, message). A receipt that names no such row is left out."""
    key = row_key(conn)
    integer = key == "rowid"
    named: dict[str, Any] = {}
    older: list[str] = []
    for receipt in dict.fromkeys(receipts):
        _, dot, suffix = receipt.rpartition(".")
        if dot and (suffix.isdecimal() if integer else suffix):
            row: Any = int(suffix) if integer else suffix
            # A number past SQLite's 64-bit rowids names no row (and cannot be bound).
            if not integer or row <= _LAST_ROWID:
                named[receipt] = row
                continue
        older.append(receipt)
    by_key = {row[-1]: row for row in _rows(conn, key, set(named.values()))}
    # Through the receipt index alone, so that only it can answer (a planner without
    # statistics would otherwise walk the whole queue).
    by_receipt = {row[_RECEIPT]: row for row in _rows(conn, "receipt", older)}
    found: dict[str, tuple[Any, Message]] = {}
    for receipt, named_key in named.items():
        row = by_key.get(named_key)
        if row is not None and _holds(row, receipt, queue):
            found[receipt] = (named_key, from_row(row[:-1]))
    for receipt, row in by_receipt.items():
        if _holds(row, receipt, queue):
            found[receipt] = (row[-1], from_row(row[:-1]))
    return found


def _holds(row: Any, receipt: str, queue: str) -> bool:
    """Whether ``row`` is a message of ``queue`` in flight under ``receipt``."""
    return bool(row[_RECEIPT] == receipt and row[_QUEUE] == queue and row[_STATE] == "delivered")


def _rows(conn: SqlConnection, column: str, values: Iterable[Any]) -> list[Any]:
    """Every column of the rows whose ``column`` is one of ``values``, then the row key."""
    wanted = list(values)
    out: list[Any] = []
    for start in range(0, len(wanted), _CHUNK):
        where, chunk = in_list(conn, column, wanted[start : start + _CHUNK])
        out += conn.execute(
            f"SELECT {_ALL}, {row_key(conn)} FROM messages WHERE {where}{row_lock(conn)}", chunk
        ).fetchall()
    return out
