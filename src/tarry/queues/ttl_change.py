"""A policy change that changes a queue's message TTL reaches the messages already waiting in
it (RabbitMQ applies policy changes to the queue), in the policy's own transaction."""

from __future__ import annotations

from tarry.queues.txn import QUEUED_STATES
from tarry.store.sql import SqlConnection

__all__ = ["restamp_expiry"]


def restamp_expiry(conn: SqlConnection, queue: str, ttl_ms: int | None) -> None:
    """The queue's message TTL in force became ``ttl_ms``: each message waiting in ``queue``
    keeps the earlier of its own expiry and the new TTL from when it entered the queue."""
    # Queued messages change here: what releases wrote and receives handed out no longer
    # says their expiry.
    for memory in (getattr(conn, "released", None), getattr(conn, "handed_out", None)):
        if memory is not None:
            memory.clear()
    for state in QUEUED_STATES:
        conn.execute(
            # Portable SQL (SQLite and PostgreSQL): CASE, not min(a, b) or least().
            "UPDATE messages SET queue_expires_at_ms = CASE "
            "WHEN CAST(?1 AS BIGINT) IS NULL THEN expires_at_ms "
            "WHEN expires_at_ms IS NULL THEN enqueued_at_ms + ?1 "
            "WHEN expires_at_ms < enqueued_at_ms + ?1 THEN expires_at_ms "
            "ELSE enqueued_at_ms + ?1 END "
            f"WHERE queue = ?2 AND state = '{state}'",
            (ttl_ms, queue),
        )
