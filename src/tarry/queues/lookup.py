"""One message's record in the queue database, by its tarry id: how the engine finds a message
released from a delayed store of its own (``tarry.engine.release``), whose queue row is keyed
in release order (``id_key``)."""

from __future__ import annotations

from tarry.model.message import Message
from tarry.store.sql import SqlConnection, id_column, id_key
from tarry.store.sqlite.rows import SELECT_SQL, from_row

__all__ = ["find_message"]


def find_message(conn: SqlConnection, message_id: str) -> Message | None:
    """The queue database's record of ``message_id`` (None when it holds none)."""
    key = id_key(conn, message_id)
    row = conn.execute(f"{SELECT_SQL} WHERE {id_column(conn)} = ?", (key,)).fetchone()
    return from_row(row) if row else None
