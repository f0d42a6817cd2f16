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
from tarry.model.state import MessageState
from tarry.queues.row_messages import ReceivedRows, RowMessages
from tarry.store.sql import (
    ACKED,
    QueueConnection,
    SqlConnection,
    in_list,
    row_key,
    row_lock,
)
from tarry.store.sqlite.rows import COLUMNS, from_row
from tarry.store.sqlite.schema import OLD_RECEIPT

__all__ = [
    "ack_handed_out",
    "hand_out",
    "held_by_receipt",
    "receipt_of",
    "settled_by_receipt",
    "write_acked",
]


_ALL = ", ".join(COLUMNS)
_QUEUE = COLUMNS.index("queue")
_BODY = COLUMNS.index("body")
_SEQ = COLUMNS.index("seq")
_STATE = COLUMNS.index("state")
_RECEIPT = COLUMNS.index("receipt")
#: The largest ``rowid`` SQLite gives a row.
_LAST_ROWID = 2**63 - 1
#: Values per look-up statement (well under SQLite's bound on parameters).
_CHUNK = 500


def receipt_of(receive_id: str, key: object) -> str:
    """The receipt ``tarry.store.sql.RECEIPT_SQL`` gives the row of ``key`` (an int or an id)
    in a receive."""
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
        row = key_named(receipt, integer=integer)
        if row is None:
            older.append(receipt)
        else:
            named[receipt] = row
    by_key = {row[-1]: row for row in _rows(conn, key, set(named.values()))}
    # Through the receipt index alone, so that only it can answer (a planner without
    # statistics would otherwise walk the whole queue). SQLite's holds only receipts of the
    # older form, and is used where the query states that condition (``OLD_RECEIPT``).
    old_form = f" AND {OLD_RECEIPT}" if integer else ""
    by_receipt = {row[_RECEIPT]: row for row in _rows(conn, "receipt", older, old_form)}
    found: dict[str, tuple[Any, Message]] = {}
    for receipt, named_key in named.items():
        row = by_key.get(named_key)
        if row is not None and _holds(row, receipt, queue):
            found[receipt] = (named_key, from_row(row[:-1]))
    for receipt, row in by_receipt.items():
        if _holds(row, receipt, queue):
            found[receipt] = (row[-1], from_row(row[:-1]))
    return found


def key_named(receipt: str, *, integer: bool) -> Any:
    """The row key ``receipt`` names (an int when ``integer``, as SQLite's ``rowid``), or None
    for a receipt not of the form ``receipt_of`` makes."""
    _, dot, suffix = receipt.rpartition(".")
    if dot and (suffix.isdecimal() if integer else suffix):
        row: Any = int(suffix) if integer else suffix
        # A number past SQLite's 64-bit rowids names no row (and cannot be bound).
        if not integer or row <= _LAST_ROWID:
            return row
    return None


def ack_handed_out(
    conn: QueueConnection, queue: str, receipts: Sequence[str], *, now_ms: int
) -> tuple[list[tuple[str, Sequence[Any], int]], list[str]]:
    """Ack the messages of ``queue`` in flight under ``receipts`` that the connection's memory
    of handed-out rows holds (``store.sqlite.row_memory``), without reading their rows: an
    UPDATE that checks each is still in flight under its receipt. Returns the memory's entries
    of the messages acked, (receipt, row, received at), in the receipts' order, and the
    receipts left for ``held_by_receipt``: those not remembered (and a receipt given twice, the
    second time, where it finds its row acked already); all of them when some remembered row
    is no longer in flight under its receipt (rare: its UPDATE is undone, and
    ``held_by_receipt`` tells which)."""
    memory = conn.handed_out
    if memory is None or not receipts:
        return [], list(receipts)
    kept: dict[int, tuple[str, Sequence[Any], int]] = {}
    rest: list[str] = []
    for receipt in receipts:
        key = key_named(receipt, integer=True)
        entry = None if key is None or key in kept else memory.get(key)
        if entry is None or entry[0] != receipt:
            rest.append(receipt)
        else:
            kept[key] = entry
    if not kept:
        return [], rest
    keys = list(kept)
    memory.forget_many(keys)
    # Rows whose receive is still a claim (``pending_receives``) are written acked by it.
    claims = conn.pending_receives
    claimed: list[int] = []
    written: list[int] = []
    for key in keys:
        (claimed if claims and claims.holds(key, kept[key][0]) else written).append(key)
    mark = claims.mark() if claims is not None else 0
    conn.execute("SAVEPOINT remembered")
    changed = claims.ack(conn, queue, claimed, now_ms=now_ms) if claims and claimed else 0
    for start in range(0, len(written), _CHUNK):
        chunk = written[start : start + _CHUNK]
        where, args = in_list(conn, "rowid", chunk)
        held, receipt_args = in_list(conn, "receipt", [kept[k][0] for k in chunk])
        # Found by rowid alone: ``+`` keeps the other columns' indexes out of the plan (the
        # in-flight index would walk every message in flight in the queue).
        changed += conn.execute(
            f"UPDATE messages SET {ACKED}, "
            f"updated_at_ms = ? WHERE {where} AND +{held} AND +queue = ? "
            "AND +state = 'delivered'",
            [now_ms, *args, *receipt_args, queue],
        ).rowcount
    if changed != len(keys):
        conn.execute("ROLLBACK TO remembered")
        conn.execute("RELEASE remembered")
        if claims is not None:
            claims.undo_to(mark)
        return [], list(receipts)
    conn.execute("RELEASE remembered")
    return list(kept.values()), rest


def hand_out(
    conn: QueueConnection, rows: Sequence[Any], receive_id: str, now_ms: int
) -> ReceivedRows:
    """The messages of ``rows`` (``SELECT_SQL``'s columns, then the row key) as the receive of
    ``receive_id`` hands them out, each with its receipt (kept as rows: no ``Message`` is made
    here); remembered for their ack where the connection keeps such a memory."""
    memory, released = conn.handed_out, conn.released
    taken = [row[:-1] for row in rows]
    receipts = [receipt_of(receive_id, row[-1]) for row in rows]
    if memory is not None:
        memory.keep_many(
            (row[-1], (receipt, columns, now_ms), len(columns[_BODY] or b""))
            for row, receipt, columns in zip(rows, receipts, taken, strict=True)
        )
    if released is not None:  # ready no more: the release's rows are over
        released.forget_many(row[_SEQ] for row in rows)
    return ReceivedRows(taken, receipts, now_ms)


def settled_by_receipt(
    conn: QueueConnection, queue: str, receipts: Sequence[str], *, ack: bool, now_ms: int
) -> tuple[Sequence[Message], dict[Any, Message], list[str]]:
    """The messages of ``queue`` in flight under ``receipts``, in the receipts' order (acked,
    with ``ack``); of those, the ones still to write, by row key (an ack writes the others
    itself, see ``ack_handed_out``); and the receipts that name no message in flight. An ack
    of remembered rows only (the usual one) keeps its messages as rows (``RowMessages``)."""
    acked, rest = ack_handed_out(conn, queue, receipts, now_ms=now_ms) if ack else ([], receipts)
    if not rest:
        rows = [row for _, row, _ in acked]
        at = [received_at_ms for _, _, received_at_ms in acked]
        return RowMessages(rows, at, MessageState.ACKED), {}, []
    done = {receipt: (row, at) for receipt, row, at in acked}
    claims = conn.pending_receives
    if claims:  # rows still claimed are found in flight only once written
        claims.write_all(conn)
    held = held_by_receipt(conn, queue, rest)
    unknown: list[str] = []
    settled: dict[Any, Message] = {}
    in_order: list[Message] = []
    for receipt in receipts:
        entry = done.pop(receipt, None)
        if entry is not None:
            message = from_row(entry[0], delivered_at_ms=entry[1])
        else:
            found = held.get(receipt)
            # The same receipt twice: the second finds nothing.
            if found is None or found[0] in settled:
                unknown.append(receipt)
                continue
            settled[found[0]] = message = found[1]
        if ack:
            message.state = MessageState.ACKED
        in_order.append(message)
    return in_order, settled, unknown


def write_acked(conn: SqlConnection, keys: Sequence[Any], now_ms: int) -> None:
    """Ack the rows of ``keys`` (``settled_by_receipt``'s still to write): one UPDATE a chunk."""
    key = row_key(conn)
    for start in range(0, len(keys), _CHUNK):
        where, chunk = in_list(conn, key, keys[start : start + _CHUNK])
        conn.execute(
            f"UPDATE messages SET {ACKED}, updated_at_ms = ? WHERE {where}",
            [now_ms, *chunk],
        )


def _holds(row: Any, receipt: str, queue: str) -> bool:
    """Whether ``row`` is a message of ``queue`` in flight under ``receipt``."""
    return bool(row[_RECEIPT] == receipt and row[_QUEUE] == queue and row[_STATE] == "delivered")


def _rows(conn: SqlConnection, column: str, values: Iterable[Any], also: str = "") -> list[Any]:
    """Every column of the rows whose ``column`` is one of ``values`` (and, ``also``, that meet
    that further condition), then the row key."""
    wanted = list(values)
    out: list[Any] = []
    for start in range(0, len(wanted), _CHUNK):
        where, chunk = in_list(conn, column, wanted[start : start + _CHUNK])
        out += conn.execute(
            f"SELECT {_ALL}, {row_key(conn)} FROM messages WHERE {where}{also}{row_lock(conn)}",
            chunk,
        ).fetchall()
    return out
