"""``SQLiteStore``: the durable embedded ``DelayedStore`` (WAL, group commit, partial index on the
due time). Claims live in memory: one process owns the database file (the data directory is
locked), so a claim correctly vanishes with the process that made it.
"""

from __future__ import annotations

import base64
import builtins
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import orjson

from tarry.errors import InvalidArgument, NotCancellable, NotFound
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState, transition
from tarry.store.base import StoreOutcome
from tarry.store.sql import SqlConnection, row_lock
from tarry.store.sqlite.database import Connection, Database
from tarry.store.sqlite.rows import (
    SELECT_SQL,
    dedupe_key,
    from_row,
    insert_rows,
    kept_by_dedupe_key,
    to_insert,
)
from tarry.store.sqlite.schema import FINISHED

__all__ = [
    "SQLiteStore",
    "decode_cursor",
    "encode_cursor",
    "insert_messages",
    "list_rows",
    "lock_for_give_up",
    "page",
]

T = TypeVar("T")


class SQLiteStore:
    #: Scheduled messages are rows of the queue database: release is one transaction.
    shares_queue_database = True

    def __init__(
        self,
        path: Path | None,
        *,
        synchronous: str = "full",
        max_pages: int | None = None,
        queues_only: bool = False,
    ):
        """``queues_only``: the queue database of a store that keeps scheduled messages
        elsewhere (``tarry.store.base``), its rows keyed in release order."""
        self.db = Database(
            path, synchronous=synchronous, max_pages=max_pages, queues_only=queues_only
        )
        #: id → claim expiry (ms); see the module docstring.
        self._claims: dict[str, int] = {}

    async def open(self) -> None:
        await self.db.open()

    async def close(self) -> None:
        await self.db.close()

    # The local queues share this database (``tarry.queues.local``); they run their work here.
    async def write(
        self,
        work: Callable[[Connection], T],
        *,
        durable: bool = False,
        first: bool = False,
        claims_aware: bool = False,
    ) -> T:
        return await self.db.write(work, durable=durable, first=first, claims_aware=claims_aware)

    async def read(self, work: Callable[[Connection], T]) -> T:
        return await self.db.read(work)

    # --- SharedDelayedStore: inside the engine's queue transaction ------------------------------
    def store_in(self, conn: SqlConnection, messages: Sequence[Message]) -> list[StoreOutcome]:
        return insert_messages(conn, messages)

    def lock_for_give_up(self, conn: SqlConnection, message_id: str, *, failures: int) -> bool:
        return lock_for_give_up(conn, message_id, failures=failures)

    # --- DelayedStore -------------------------------------------------------------------------
    async def probe(self) -> None:
        await self.db.write(lambda conn: conn.execute("SELECT 1").fetchone())

    async def store(self, messages: Sequence[Message]) -> list[StoreOutcome]:
        return await self.db.write(lambda conn: insert_messages(conn, messages), durable=True)

    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> list[Message]:
        claims = self._claims
        for message_id, until in list(claims.items()):
            if until <= now_ms:
                del claims[message_id]

        def work(conn: Connection) -> list[Message]:
            rows = conn.execute(
                f"{SELECT_SQL} WHERE state = 'scheduled' AND deliver_at_ms <= ? "
                "AND retry_at_ms <= ? ORDER BY deliver_at_ms, id LIMIT ?",
                (now_ms, now_ms, limit + len(claims)),
            ).fetchall()
            return [from_row(r) for r in rows if r[0] not in claims][:limit]

        due = await self.db.read(work)
        for message in due:
            claims[message.id] = now_ms + lease_ms
        return due

    async def next_due_time(self) -> int | None:
        claims = self._claims

        def work(conn: Connection) -> int | None:
            cursor = conn.execute(
                "SELECT id, max(deliver_at_ms, retry_at_ms) FROM messages "
                "WHERE state = 'scheduled' ORDER BY deliver_at_ms, id LIMIT ?",
                (len(claims) + 64,),
            )
            times = [due for message_id, due in cursor if message_id not in claims]
            return min(times) if times else None

        return await self.db.read(work)

    def release_claims(self, ids: Sequence[str]) -> None:
        """End claims, after the caller's write committed. A claim ends by expiring (0), not by
        vanishing: reads run on their own connection, so a ``fetch_due`` whose read began
        before that commit can still see these messages as scheduled in its older snapshot;
        they stay filtered out until the next ``fetch_due``, whose read starts after it."""
        for message_id in ids:
            if message_id in self._claims:
                self._claims[message_id] = 0

    def hold_claims(self, ids: Sequence[str], *, until_ms: int) -> None:
        """Keep claimed messages back until ``until_ms`` without counting a failure (their
        destination is away); ``fetch_due`` returns them again after that."""
        for message_id in ids:
            if message_id in self._claims:
                self._claims[message_id] = until_ms

    def is_claimed(self, message_id: str) -> bool:
        return self._claims.get(message_id, 0) > 0

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        def work(conn: Connection) -> int:
            cursor = conn.executemany(
                "UPDATE messages SET state = ?, body = NULL, updated_at_ms = ? "
                "WHERE id = ? AND state = 'scheduled'",
                [(state.value, now_ms, i) for i in ids],
            )
            return cursor.rowcount

        try:
            return await self.db.write(work)
        finally:
            self.release_claims(ids)

    async def record_failure(self, message_id: str, *, error: str, retry_at_ms: int) -> int:
        def work(conn: Connection) -> int:
            row = conn.execute(
                "UPDATE messages SET failures = failures + 1, last_error = ?, retry_at_ms = ? "
                "WHERE id = ? AND state = 'scheduled' RETURNING failures",
                (error[:2000], retry_at_ms, message_id),
            ).fetchone()
            return int(row[0]) if row else 0

        try:
            return await self.db.write(work)
        finally:
            self.release_claims([message_id])

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        self._refuse_claimed(message_id)
        return await self.db.write(
            lambda conn: cancel_message(conn, message_id, now_ms=now_ms), durable=True
        )

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        self._refuse_claimed(message_id)
        return await self.db.write(
            lambda conn: reschedule_message(
                conn, message_id, deliver_at_ms=deliver_at_ms, now_ms=now_ms
            ),
            durable=True,
        )

    async def get(self, message_id: str) -> Message | None:
        def work(conn: Connection) -> Message | None:
            row = conn.execute(f"{SELECT_SQL} WHERE id = ?", (message_id,)).fetchone()
            return from_row(row) if row else None

        return await self.db.read(work)

    async def list(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        return page(
            await self.db.read(lambda conn: list_rows(conn, query, query.limit + 1)), query.limit
        )

    async def count_scheduled(self, destination: str | None = None) -> int:
        params: tuple[str, ...] = ()
        if destination is None:
            sql = "SELECT count(*) FROM messages WHERE state = 'scheduled'"
        else:
            sql = "SELECT count(*) FROM messages WHERE destination = ? AND state = 'scheduled'"
            params = (destination,)
        return int(await self.db.read(lambda conn: conn.execute(sql, params).fetchone()[0]))

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> builtins.list[int]:
        return await self.db.read(lambda conn: due_counts(conn, start_ms, width_ms, buckets))

    async def purge_finished(self, *, before_ms: int, limit: int = 5000) -> int:
        """Forget finished messages older than the retention window."""

        def work(conn: Connection) -> int:
            return conn.execute(
                "DELETE FROM messages WHERE rowid IN (SELECT rowid FROM messages WHERE "
                f"{FINISHED} AND updated_at_ms < ? LIMIT ?)",
                (before_ms, limit),
            ).rowcount

        return await self.db.write(work)

    async def check(self) -> builtins.list[str]:
        """Integrity problems found (empty when the database is sound)."""

        def work(conn: Connection) -> list[str]:
            problems = [r[0] for r in conn.execute("PRAGMA integrity_check") if r[0] != "ok"]
            bad = conn.execute(
                "SELECT count(*) FROM messages WHERE state = 'ready' AND queue IS NULL"
            ).fetchone()[0]
            if bad:
                problems.append(f"{bad} queued messages have no queue")
            return problems

        return await self.db.read(work)

    def _refuse_claimed(self, message_id: str) -> None:
        if self.is_claimed(message_id):
            raise NotCancellable(
                f"message {message_id} is being delivered right now; it can no longer be changed"
            )


def insert_messages(conn: SqlConnection, messages: Sequence[Message]) -> list[StoreOutcome]:
    """Insert ``messages``; one whose (destination, message_id) is already kept is not stored
    again and the kept one is returned instead."""
    if not any(m.message_id for m in messages):
        insert_rows(conn, [to_insert(m) for m in messages])
        return [StoreOutcome(m, True) for m in messages]
    keys = [dedupe_key(m) for m in messages]
    kept = kept_by_dedupe_key(conn, {k for k in keys if k is not None})
    outcomes = []
    for message, key in zip(messages, keys, strict=True):
        if key is not None:
            if key in kept:
                outcomes.append(StoreOutcome(replace(kept[key]), False))
                continue
            kept[key] = message  # a repeat later in this batch gets this one
        conn.execute(*to_insert(message))
        outcomes.append(StoreOutcome(message, True))
    return outcomes


def lock_for_give_up(conn: SqlConnection, message_id: str, *, failures: int) -> bool:
    """``SharedDelayedStore.lock_for_give_up`` (SQLite and PostgreSQL alike)."""
    row = conn.execute(
        f"SELECT state FROM messages WHERE id = ?{row_lock(conn)}", (message_id,)
    ).fetchone()
    if row is None or row[0] != MessageState.SCHEDULED.value:
        return False  # cancelled or finished meanwhile
    conn.execute("UPDATE messages SET failures = ? WHERE id = ?", (failures, message_id))
    return True


def list_rows(conn: SqlConnection, query: MessageQuery, count: int) -> list[Message]:
    """Up to ``count`` messages matching ``query`` (filters and cursor) in (deliver_at, id)
    order."""
    where: list[str] = ["1 = 1"]
    params: list[object] = []
    for column, value in (
        ("destination", query.destination),
        ("correlation_id", query.correlation_id),
        ("message_id", query.message_id),
        ("state", query.state),
    ):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if query.due_after_ms is not None:
        where.append("deliver_at_ms >= ?")
        params.append(query.due_after_ms)
    if query.due_before_ms is not None:
        where.append("deliver_at_ms < ?")
        params.append(query.due_before_ms)
    if query.cursor:
        after_due, after_id = decode_cursor(query.cursor)
        where.append("(deliver_at_ms > ? OR (deliver_at_ms = ? AND id > ?))")
        params += [after_due, after_due, after_id]
    sql = f"{SELECT_SQL} WHERE {' AND '.join(where)} ORDER BY deliver_at_ms, id LIMIT ?"
    return [from_row(r) for r in conn.execute(sql, (*params, count))]


def due_counts(conn: SqlConnection, start_ms: int, width_ms: int, buckets: int) -> list[int]:
    """Scheduled messages per window (``DelayedStore.due_counts``): one range scan of the
    ``messages_due`` index, counted by window in the database."""
    counts = [0] * buckets
    if buckets <= 0 or width_ms <= 0:
        return counts
    # The literal state (not a parameter) lets the planner use the partial index; the casts
    # make PostgreSQL divide whole numbers.
    rows = conn.execute(
        "SELECT (deliver_at_ms - CAST(? AS BIGINT)) / CAST(? AS BIGINT) AS slot, count(*) "
        "FROM messages WHERE state = 'scheduled' AND deliver_at_ms >= ? AND deliver_at_ms < ? "
        "GROUP BY slot",
        (start_ms, width_ms, start_ms, start_ms + width_ms * buckets),
    ).fetchall()
    for slot, count in rows:
        if 0 <= int(slot) < buckets:
            counts[int(slot)] = int(count)
    return counts


def get_for_update(conn: SqlConnection, message_id: str) -> Message:
    """The message, its row locked until the transaction ends. Raises ``not_found``."""
    row = conn.execute(f"{SELECT_SQL} WHERE id = ?{row_lock(conn)}", (message_id,)).fetchone()
    if row is None:
        raise NotFound(f"no message with id {message_id}")
    return from_row(row)


def cancel_message(conn: SqlConnection, message_id: str, *, now_ms: int) -> Message:
    message = get_for_update(conn, message_id)
    transition(message_id, message.state, MessageState.CANCELLED)
    conn.execute(
        "UPDATE messages SET state = 'cancelled', body = NULL, updated_at_ms = ? WHERE id = ?",
        (now_ms, message_id),
    )
    message.state, message.updated_at_ms = MessageState.CANCELLED, now_ms
    return message


def reschedule_message(
    conn: SqlConnection, message_id: str, *, deliver_at_ms: int, now_ms: int
) -> Message:
    message = get_for_update(conn, message_id)
    if message.state is not MessageState.SCHEDULED:
        raise NotCancellable(
            f"message {message_id} is {message.state.value}; only scheduled messages can "
            "be rescheduled"
        )
    conn.execute(
        "UPDATE messages SET deliver_at_ms = ?, retry_at_ms = 0, updated_at_ms = ? WHERE id = ?",
        (deliver_at_ms, now_ms, message_id),
    )
    message.deliver_at_ms, message.updated_at_ms = deliver_at_ms, now_ms
    return message


def page(rows: list[Message], limit: int) -> tuple[list[Message], str | None]:
    """Cut the extra row off and turn it into the next page's cursor."""
    if len(rows) > limit:
        last = rows[limit - 1]
        return rows[:limit], encode_cursor(last.deliver_at_ms, last.id)
    return rows, None


def encode_cursor(deliver_at_ms: int, message_id: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([deliver_at_ms, message_id])).decode()


def early_cursor(due_ms: int) -> str:
    """The cursor of a page that ended early (``DelayedStore.list``): every message due before
    ``due_ms`` was read (no id is empty, so ``(due_ms, "")`` comes before every message due
    then)."""
    return encode_cursor(due_ms, "")


def ended_early(cursor: str | None) -> int | None:
    """The due time an early-ended page read up to (None for a full page's cursor)."""
    if cursor is None:
        return None
    due, message_id = decode_cursor(cursor)
    return due if message_id == "" else None


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        due, message_id = orjson.loads(base64.urlsafe_b64decode(cursor.encode()))
        return int(due), str(message_id)
    except Exception:
        raise InvalidArgument(
            "cursor is not one this server handed out; start without it"
        ) from None
