"""The redrive outbox (``tarry.engine.redrive``): messages a redrive chunk made for a delayed
store of its own, kept in the chunk's transaction until that store holds them, so a crash in
between loses none and keeps none twice. Rows hold the log store's record encoding."""

from __future__ import annotations

from collections.abc import Sequence

from tarry.errors import InvalidArgument
from tarry.model.message import Message
from tarry.store.log.record import Record, decode_message, encode_message, parse_record
from tarry.store.sql import SqlConnection

__all__ = ["create_outbox", "drop_outbox", "put_outbox", "read_outbox"]


def create_outbox(conn: SqlConnection) -> None:
    """The outbox table, where a store of its own needs one (made at start, kept empty)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS redrive_outbox (id TEXT PRIMARY KEY, record BLOB NOT NULL)"
    )


def put_outbox(conn: SqlConnection, messages: Sequence[Message]) -> None:
    conn.executemany(
        "INSERT INTO redrive_outbox (id, record) VALUES (?, ?)",
        [(m.id, encode_message(m)) for m in messages],
    )


def read_outbox(conn: SqlConnection) -> list[Message]:
    """Every message the outbox holds (rows a crash left)."""
    return [_decode(bytes(row[0])) for row in conn.execute("SELECT record FROM redrive_outbox")]


def drop_outbox(conn: SqlConnection, ids: Sequence[str] | None = None) -> None:
    """Let ``ids`` go (the delayed store holds them now); all of them when ``ids`` is None."""
    if ids is None:
        conn.execute("DELETE FROM redrive_outbox")
    else:
        conn.executemany("DELETE FROM redrive_outbox WHERE id = ?", [(i,) for i in ids])


def _decode(blob: bytes) -> Message:
    record = parse_record(blob, 0)
    if not isinstance(record, Record):
        raise InvalidArgument(f"a redrive outbox row is damaged ({record})")
    return decode_message(record.payload)[0]
