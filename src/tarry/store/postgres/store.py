"""``PostgresStore``: the ``DelayedStore`` that several tarry nodes share.

Claims. ``fetch_due`` picks the next due rows with ``FOR UPDATE SKIP LOCKED`` (rows another
node is claiming right now are skipped, never waited on) and stamps them with this node's name
and a lease (``claim_until_ms``). Until the lease lapses no other node fetches them; a node
that dies holding claims loses them after at most ``lease_ms`` and another node delivers them.
This is the SQL Server store's ``READPAST, UPDLOCK, ROWLOCK`` (reference §2.2) with a lease
added, because tarry's hand-over to a transport is not inside the fetch transaction.

Exactly-once into local queues. ``release_claimed`` (called inside the release transaction)
re-locks the rows this node still holds: only those are moved into their queues, in the same
transaction, so a release racing a lapsed lease on another node cannot happen twice.

Wake-ups. ``announce_due`` sends ``NOTIFY tarry_due`` so the other nodes' dispatchers wake for
an earlier message (``listen.py``).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tarry.errors import NotCancellable, TarryError
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import TERMINAL, MessageState
from tarry.store.base import StoreOutcome
from tarry.store.postgres.database import PgDatabase
from tarry.store.postgres.dialect import PgConnection, translate
from tarry.store.postgres.listen import CHANNEL_CATALOG, CHANNEL_DUE, CHANNEL_FILLED, Listener
from tarry.store.sqlite.rows import COLUMNS, SELECT_SQL, from_row
from tarry.store.sqlite.store import (
    cancel_message,
    due_counts,
    insert_messages,
    list_rows,
    lock_for_give_up,
    page,
    reschedule_message,
)

__all__ = ["PostgresStore", "node_name"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_TERMINAL_SQL = "(" + ",".join(f"'{s.value}'" for s in TERMINAL) + ")"
_RETURNING = ", ".join(f"m.{c}" for c in COLUMNS)
_SELECT_PG = translate(SELECT_SQL)[0]


def node_name() -> str:
    """This process's name in claims: host, pid and a random part (a restarted node with a
    reused pid is still another claimer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class PostgresStore:
    def __init__(
        self,
        dsn: str,
        *,
        node: str | None = None,
        pool_size: int = 4,
        connect_timeout_ms: int = 3_000,
        notify_horizon_ms: int = 60_000,
        shares_queue_database: bool = True,
    ) -> None:
        #: True (``exactly_once``): the local queues live in this database too, and release is
        #: one transaction. False (``at_least_once``): each node keeps its own queue database.
        self.shares_queue_database = shares_queue_database
        self.node = node or node_name()
        self.db = PgDatabase(
            dsn,
            pool_size=pool_size,
            connect_timeout_ms=connect_timeout_ms,
            application_name=self.node[:63],
        )
        self.listener = Listener(dsn)
        #: NOTIFY only for messages due sooner than this (later ones: the capped sleep).
        self.notify_horizon_ms = notify_horizon_ms
        self._due_pending: int | None = None
        self._due_task: asyncio.Task[None] | None = None
        #: Claim updates sent after the fact (``hold_claims`` is synchronous in the contract).
        self._claim_updates: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        await self.db.open()
        self.listener.start()

    async def close(self) -> None:
        if self._due_task is not None:
            await asyncio.gather(self._due_task, return_exceptions=True)
        await self.settle()
        await self.listener.stop()
        await self.db.close()

    # --- the engine's shared transactions (same face as SQLiteStore.write/read) ---------------
    async def write(
        self,
        work: Callable[[PgConnection], T],
        *,
        durable: bool = False,
        first: bool = False,
        claims_aware: bool = False,
    ) -> T:
        """Run ``work`` in one transaction. Every commit is durable (PostgreSQL's own
        ``synchronous_commit`` decides); ``durable`` is accepted for the common face, and so are
        ``first`` (transactions run side by side on the pool's connections) and
        ``claims_aware`` (every receive writes its rows at once here)."""
        return await self.db.run(work)

    async def read(self, work: Callable[[PgConnection], T]) -> T:
        return await self.db.run(work)

    def release_claimed(self, conn: PgConnection, ids: Sequence[str]) -> set[str]:
        """Inside a release transaction: lock the rows of ``ids`` this node still holds (still
        scheduled, claimed by this node) and return their ids. Rows whose lease lapsed and that
        another node took meanwhile are left out, so they are not released twice."""
        rows = conn.raw.execute(
            "SELECT id FROM messages WHERE id = ANY(%s) AND state = 'scheduled' "
            "AND claimed_by = %s FOR UPDATE",
            (list(ids), self.node),
        ).fetchall()
        return {str(r[0]) for r in rows}

    def claim_due(self, conn: PgConnection, *, now_ms: int, limit: int) -> list[Message]:
        """Inside a transaction: the next due messages no other node holds, oldest due first,
        their rows locked until commit (rows another node is taking right now are skipped)."""
        rows = conn.raw.execute(
            f"{_SELECT_PG} WHERE state = 'scheduled' AND deliver_at_ms <= %(now)s "
            "AND retry_at_ms <= %(now)s AND (claimed_by IS NULL OR claim_until_ms <= %(now)s) "
            "ORDER BY deliver_at_ms, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
            {"now": now_ms, "limit": limit},
        ).fetchall()
        return [from_row(r) for r in rows]

    def claim(self, conn: PgConnection, ids: Sequence[str], *, until_ms: int) -> None:
        """Inside the transaction of ``claim_due``: keep ``ids`` claimed by this node after the
        commit, until ``until_ms`` (for work that happens outside it: transports, failures)."""
        if ids:
            conn.raw.execute(
                "UPDATE messages SET claimed_by = %s, claim_until_ms = %s WHERE id = ANY(%s)",
                (self.node, until_ms, list(ids)),
            )

    # --- notifications --------------------------------------------------------------------------
    def announce_due(self, deliver_at_ms: int, *, now_ms: int) -> None:
        """Wake the other nodes' dispatchers for a message due at ``deliver_at_ms`` (already
        committed). Sent in the background, the earliest of those pending in one NOTIFY, so a
        producer never waits for it; a lost wake-up only costs latency (the capped sleep)."""
        if deliver_at_ms - now_ms > self.notify_horizon_ms:
            return
        if self._due_pending is None or deliver_at_ms < self._due_pending:
            self._due_pending = deliver_at_ms
        if self._due_task is None or self._due_task.done():
            self._due_task = asyncio.get_running_loop().create_task(self._send_due())

    async def _send_due(self) -> None:
        while self._due_pending is not None:
            due, self._due_pending = self._due_pending, None
            try:
                await self.notify(CHANNEL_DUE, str(due))
            except TarryError as exc:
                log.warning("could not wake the other nodes: %s", exc)
                return

    async def notify(self, channel: str, *payloads: str) -> None:
        async with self.db.transaction() as conn:
            await conn.execute(
                "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (channel, list(payloads))
            )

    async def announce_filled(self, queues: Sequence[str]) -> None:
        """Tell the other nodes' waiting consumers that ``queues`` received messages."""
        await self.notify(CHANNEL_FILLED, *queues)

    def on_due(self, handler: Callable[[int], None]) -> None:
        self.listener.subscribe(CHANNEL_DUE, lambda payload: handler(int(payload)))

    def on_catalog_change(self, handler: Callable[[], None]) -> None:
        """``handler`` runs when another node changed the catalog (this node's own changes are
        already in its memory), and each time the listener's LISTEN comes into force (changes
        made before it, at start or while it was away, told no one here)."""

        def changed(node: str) -> None:
            if node != self.node[:63]:
                handler()

        self.listener.subscribe(CHANNEL_CATALOG, changed)
        self.listener.on_listening.append(handler)

    def on_filled(self, handler: Callable[[str], None]) -> None:
        self.listener.subscribe(CHANNEL_FILLED, handler)

    # --- SharedDelayedStore: inside the engine's queue transaction (exactly_once) ---------------
    def store_in(self, conn: PgConnection, messages: Sequence[Message]) -> list[StoreOutcome]:
        """Announcing the due time is the engine's, after the commit (``cluster.announce_due``)."""
        return insert_messages(conn, messages)

    def lock_for_give_up(self, conn: PgConnection, message_id: str, *, failures: int) -> bool:
        return lock_for_give_up(conn, message_id, failures=failures)

    # --- DelayedStore -------------------------------------------------------------------------
    async def probe(self) -> None:
        await self.db.run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def store(self, messages: Sequence[Message]) -> list[StoreOutcome]:
        outcomes = await self.db.run(lambda conn: insert_messages(conn, messages))
        created = [o.message.deliver_at_ms for o in outcomes if o.created]
        if created:
            self.announce_due(min(created), now_ms=min(created))
        return outcomes

    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> list[Message]:
        async with self.db.transaction() as conn:
            cursor = await conn.execute(
                "WITH due AS (SELECT id FROM messages WHERE state = 'scheduled' "
                "AND deliver_at_ms <= %(now)s AND retry_at_ms <= %(now)s "
                "AND (claimed_by IS NULL OR claim_until_ms <= %(now)s) "
                "ORDER BY deliver_at_ms, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
                "UPDATE messages m SET claimed_by = %(node)s, claim_until_ms = %(until)s "
                f"FROM due WHERE m.id = due.id RETURNING {_RETURNING}",
                {"now": now_ms, "limit": limit, "node": self.node, "until": now_ms + lease_ms},
            )
            rows = await cursor.fetchall()
        messages = [from_row(r) for r in rows]
        messages.sort(key=lambda m: (m.deliver_at_ms, m.id))
        return messages

    async def next_due_time(self) -> int | None:
        """The earliest of: an unclaimed message's due (or retry) time, and a claim's lapse
        (a dead node's messages are due again then)."""
        async with self.db.transaction() as conn:
            cursor = await conn.execute(
                "SELECT greatest(deliver_at_ms, retry_at_ms) FROM messages "
                "WHERE state = 'scheduled' AND claimed_by IS NULL "
                "ORDER BY deliver_at_ms, id LIMIT 64"
            )
            times = [int(r[0]) for r in await cursor.fetchall()]
            cursor = await conn.execute(
                "SELECT min(claim_until_ms) FROM messages "
                "WHERE state = 'scheduled' AND claimed_by IS NOT NULL"
            )
            row = await cursor.fetchone()
        if row is not None and row[0] is not None:
            times.append(int(row[0]))
        return min(times) if times else None

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        async with self.db.transaction() as conn:
            cursor = await conn.execute(
                "UPDATE messages SET state = %s, body = NULL, updated_at_ms = %s, "
                "claimed_by = NULL, claim_until_ms = NULL "
                "WHERE id = ANY(%s) AND state = 'scheduled'",
                (state.value, now_ms, list(ids)),
            )
            return cursor.rowcount

    async def record_failure(self, message_id: str, *, error: str, retry_at_ms: int) -> int:
        async with self.db.transaction() as conn:
            cursor = await conn.execute(
                "UPDATE messages SET failures = failures + 1, last_error = %s, retry_at_ms = %s, "
                "claimed_by = NULL, claim_until_ms = NULL "
                "WHERE id = %s AND state = 'scheduled' "
                "AND (claimed_by IS NULL OR claimed_by = %s) RETURNING failures",
                (error[:2000], retry_at_ms, message_id, self.node),
            )
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    def release_claims(self, ids: Sequence[str]) -> None:
        """Claims live in the database: they end with the release transaction or lapse."""

    def hold_claims(self, ids: Sequence[str], *, until_ms: int) -> None:
        """Keep claimed messages back until ``until_ms`` without counting a failure (their
        destination is away): the claim's lease is set to end then, so the message falls due
        again after the breaker's wait (on any node) rather than after the whole lease. Sent in
        the background; if PostgreSQL cannot take it, the lease simply runs its course."""
        task = asyncio.get_running_loop().create_task(self._hold(list(ids), until_ms))
        self._claim_updates.add(task)
        task.add_done_callback(self._claim_updates.discard)

    async def _hold(self, ids: list[str], until_ms: int) -> None:
        try:
            async with self.db.transaction() as conn:
                await conn.execute(
                    "UPDATE messages SET claim_until_ms = %s "
                    "WHERE id = ANY(%s) AND state = 'scheduled' AND claimed_by = %s",
                    (until_ms, ids, self.node),
                )
        except TarryError as exc:
            log.warning("could not shorten the claims of held messages (they lapse): %s", exc)

    async def settle(self) -> None:
        """Wait for claim updates sent in the background (tests, and before closing)."""
        await asyncio.gather(*self._claim_updates, return_exceptions=True)

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        def work(conn: PgConnection) -> Message:
            _refuse_claimed(conn, message_id, now_ms)
            return cancel_message(conn, message_id, now_ms=now_ms)

        return await self.db.run(work)

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        def work(conn: PgConnection) -> Message:
            _refuse_claimed(conn, message_id, now_ms)
            return reschedule_message(conn, message_id, deliver_at_ms=deliver_at_ms, now_ms=now_ms)

        return await self.db.run(work)

    async def get(self, message_id: str) -> Message | None:
        async with self.db.transaction() as conn:
            cursor = await conn.execute(f"{_SELECT_PG} WHERE id = %s", (message_id,))
            row = await cursor.fetchone()
        return from_row(row) if row else None

    async def list(self, query: MessageQuery) -> tuple[builtins.list[Message], str | None]:
        rows = await self.db.run(lambda conn: list_rows(conn, query, query.limit + 1))
        return page(rows, query.limit)

    async def count_scheduled(self, destination: str | None = None) -> int:
        async with self.db.transaction() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM messages WHERE state = 'scheduled' "
                "AND (%(d)s::text IS NULL OR destination = %(d)s)",
                {"d": destination},
            )
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> builtins.list[int]:
        return await self.db.run(lambda conn: due_counts(conn, start_ms, width_ms, buckets))

    async def purge_finished(self, *, before_ms: int, limit: int = 5000) -> int:
        """Forget finished messages older than the retention window."""
        async with self.db.transaction() as conn:
            cursor = await conn.execute(
                "DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE state IN "
                f"{_TERMINAL_SQL} AND updated_at_ms < %s LIMIT %s FOR UPDATE SKIP LOCKED)",
                (before_ms, limit),
            )
            return cursor.rowcount

    async def check(self) -> builtins.list[str]:
        """Integrity problems found (empty when the database is sound)."""
        problems: builtins.list[str] = []
        async with self.db.transaction() as conn:
            checks: builtins.list[tuple[str, str]] = [
                (
                    "scheduled messages without a due time",
                    "state = 'scheduled' AND deliver_at_ms IS NULL",
                ),
                ("claims without a lease", "claimed_by IS NOT NULL AND claim_until_ms IS NULL"),
            ]
            if self.shares_queue_database:
                # at_least_once: a row released into a node's own queue database ends here
                # as 'ready' without a queue (the queue is in that node's file).
                checks.append(
                    ("queued messages have no queue", "state = 'ready' AND queue IS NULL")
                )
            for what, where in checks:
                cursor = await conn.execute(f"SELECT count(*) FROM messages WHERE {where}".encode())
                row = await cursor.fetchone()
                if row and row[0]:
                    problems.append(f"{row[0]} {what}")
        return problems


def _refuse_claimed(conn: PgConnection, message_id: str, now_ms: int) -> None:
    """A message another node (or this one) is delivering right now cannot be changed."""
    row: Any = conn.raw.execute(
        "SELECT claim_until_ms FROM messages WHERE id = %s AND state = 'scheduled' "
        "AND claimed_by IS NOT NULL FOR UPDATE",
        (message_id,),
    ).fetchone()
    if row is not None and int(row[0]) > now_ms:
        raise NotCancellable(
            f"message {message_id} is being delivered right now; it can no longer be changed"
        )
