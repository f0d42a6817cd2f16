"""Message ↔ row conversion for the ``messages`` table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from tarry.model.message import Death, Message, Report, Undeliverable
from tarry.model.state import MessageState

__all__ = ["COLUMNS", "INSERT_SQL", "SELECT_SQL", "from_row", "to_row"]

COLUMNS = (
    "id",
    "destination",
    "topic",
    "state",
    "body",
    "headers",
    "sent_at_ms",
    "deliver_at_ms",
    "expires_at_ms",
    "message_id",
    "dedupe_key",
    "correlation_id",
    "reply_to",
    "report",
    "on_undeliverable",
    "persistent",
    "failures",
    "last_error",
    "deaths",
    "queue",
    "seq",
    "enqueued_at_ms",
    "queue_expires_at_ms",
    "visible_at_ms",
    "receipt",
    "redelivered",
    "delivery_count",
    "updated_at_ms",
)
SELECT_SQL = f"SELECT {', '.join(COLUMNS)} FROM messages"
INSERT_SQL = (
    f"INSERT INTO messages ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
)


def dedupe_key(message: Message) -> str | None:
    """Producer sends de-duplicate on (destination, message_id), where a topic copy's destination
    is its topic and queue; copies tarry makes itself (dead letters, reports) do not.
    The parts are joined with U+001F (unit separator): names cannot hold it and text columns
    of every store can (PostgreSQL refuses NUL)."""
    if message.message_id is None or message.deaths:
        return None
    return f"{message.topic or ''}\x1f{message.destination}\x1f{message.message_id}"


def to_row(
    message: Message,
    *,
    seq: int | None = None,
    receipt: str | None = None,
    visible_at_ms: int | None = None,
    dedupe: bool = True,
) -> tuple[Any, ...]:
    return (
        message.id,
        message.destination,
        message.topic,
        message.state.value,
        message.body,
        orjson.dumps(message.headers).decode(),
        message.sent_at_ms,
        message.deliver_at_ms,
        message.expires_at_ms,
        message.message_id,
        dedupe_key(message) if dedupe else None,
        message.correlation_id,
        message.reply_to,
        ",".join(sorted(r.value for r in message.report)),
        message.on_undeliverable.value,
        int(message.persistent),
        message.failures,
        message.last_error,
        orjson.dumps([d.to_dict() for d in message.deaths]).decode() if message.deaths else None,
        message.queue,
        seq,
        message.enqueued_at_ms,
        message.queue_expires_at_ms,
        visible_at_ms,
        receipt,
        int(message.redelivered),
        message.delivery_count,
        message.updated_at_ms,
    )


def from_row(row: Sequence[Any]) -> Message:
    (
        id_,
        destination,
        topic,
        state,
        body,
        headers,
        sent_at,
        deliver_at,
        expires_at,
        message_id,
        _dedupe,
        correlation_id,
        reply_to,
        report,
        on_undeliverable,
        persistent,
        failures,
        last_error,
        deaths,
        queue,
        _seq,
        enqueued_at,
        queue_expires_at,
        _visible_at,
        _receipt,
        redelivered,
        delivery_count,
        updated_at,
    ) = row
    return Message(
        id=id_,
        destination=destination,
        topic=topic,
        state=MessageState(state),
        body=body or b"",
        headers=orjson.loads(headers),
        sent_at_ms=sent_at,
        deliver_at_ms=deliver_at,
        expires_at_ms=expires_at,
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to=reply_to,
        report=frozenset(Report(r) for r in report.split(",") if r),
        on_undeliverable=Undeliverable(on_undeliverable),
        persistent=bool(persistent),
        failures=failures,
        last_error=last_error,
        deaths=[Death.from_dict(d) for d in orjson.loads(deaths)] if deaths else [],
        queue=queue,
        enqueued_at_ms=enqueued_at,
        queue_expires_at_ms=queue_expires_at,
        redelivered=bool(redelivered),
        delivery_count=delivery_count,
        updated_at_ms=updated_at,
    )
