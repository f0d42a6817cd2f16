"""The message model: what a producer asks for (``SendRequest``), what validation decides
(``SendPlan``), and what tarry keeps (``Message``, with its ``Death`` records)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tarry.model.state import TERMINAL, MessageState

__all__ = [
    "MAX_DELAY_MS",
    "MAX_INSTANT_MS",
    "MAX_INT64",
    "MAX_TTL_MS",
    "Death",
    "DeathReason",
    "Message",
    "Report",
    "SendPlan",
    "SendRequest",
    "NO_REPORT",
    "Undeliverable",
    "parse_reports",
    "plain_message",
    "reports_text",
]

#: 2^28 − 1 seconds (about 8.5 years): the span of the 28-level RabbitMQ delay topology.
MAX_DELAY_MS = ((1 << 28) - 1) * 1000
#: RabbitMQ's upper limit for TTLs and queue expiry: 10 years in milliseconds.
MAX_TTL_MS = 315_360_000_000
#: The last millisecond of 9999-12-31 UTC: the latest instant RFC 3339 can write.
MAX_INSTANT_MS = 253_402_300_799_999
#: The largest whole number every store keeps (SQLite INTEGER, PostgreSQL bigint, the log's
#: int64 fields): the bound of counts and sizes without a tighter one of their own.
MAX_INT64 = (1 << 63) - 1


class Report(StrEnum):
    #: A report to ``reply_to`` when the message expires before a consumer takes it.
    EXPIRATION = "expiration"
    #: A report to ``reply_to`` when the message cannot be delivered to its destination.
    EXCEPTION = "exception"


class Undeliverable(StrEnum):
    #: Move an undeliverable or expired message to a dead-letter queue (the default).
    DEAD_LETTER = "dead_letter"
    #: Throw it away (IBM MQ's ``MQRO_DISCARD_MSG``).
    DISCARD = "discard"


class DeathReason(StrEnum):
    EXPIRED = "expired"
    REJECTED = "rejected"
    MAXLEN = "maxlen"
    DELIVERY_FAILED = "delivery_failed"


@dataclass(slots=True)
class Death:
    """One entry of a message's ``deaths``: one per (queue, reason) pair, newest first, as in
    RabbitMQ's ``x-death``; ``time_ms`` is the first death for the pair."""

    reason: DeathReason
    queue: str
    time_ms: int
    count: int
    destination: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "queue": self.queue,
            "time": self.time_ms,
            "count": self.count,
            "destination": self.destination,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Death:
        return cls(
            reason=DeathReason(data["reason"]),
            queue=data["queue"],
            time_ms=int(data["time"]),
            count=int(data["count"]),
            destination=data["destination"],
        )


@dataclass(slots=True)
class SendRequest:
    """A send as a producer states it, after syntax parsing, before any rule is checked."""

    destination: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    ttl_ms: int | None = None
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    report: frozenset[Report] = frozenset()
    on_undeliverable: Undeliverable = Undeliverable.DEAD_LETTER
    group_id: str | None = None
    retain: bool = False
    persistent: bool = True


# Not frozen: a batch makes one per send, and a frozen dataclass's __init__ (object.__setattr__
# per field) costs three times a plain one's.
@dataclass(slots=True)
class SendPlan:
    """What validation decided: when the message was sent, falls due and expires."""

    request: SendRequest
    sent_at_ms: int
    deliver_at_ms: int
    expires_at_ms: int | None

    @property
    def delayed(self) -> bool:
        return self.deliver_at_ms > self.sent_at_ms


@dataclass(slots=True)
class Message:
    """A message as tarry keeps it. One row of the store; one copy per topic subscriber."""

    id: str
    destination: str
    body: bytes
    headers: dict[str, str]
    sent_at_ms: int
    deliver_at_ms: int
    expires_at_ms: int | None
    state: MessageState = MessageState.SCHEDULED
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    report: frozenset[Report] = frozenset()
    on_undeliverable: Undeliverable = Undeliverable.DEAD_LETTER
    persistent: bool = True
    #: The topic a copy was fanned out from, if any.
    topic: str | None = None
    #: Failed delivery attempts so far (the MSMQ store's ``RetryCount``).
    failures: int = 0
    last_error: str | None = None
    deaths: list[Death] = field(default_factory=list)
    #: Set once the message is in a local queue.
    queue: str | None = None
    enqueued_at_ms: int | None = None
    #: The earlier of the message's own expiry and the queue's TTL, fixed on entering the queue.
    queue_expires_at_ms: int | None = None
    redelivered: bool = False
    delivery_count: int = 0
    #: When the last state change happened (release, receive, ack, ...).
    updated_at_ms: int = 0

    @property
    def body_text(self) -> str | None:
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            return None

    @property
    def body_base64(self) -> str:
        return base64.b64encode(self.body).decode("ascii")

    def to_public(self) -> dict[str, Any]:
        """The message's metadata and state as the HTTP API shows it."""
        return {
            "id": self.id,
            "destination": self.destination,
            "topic": self.topic,
            "state": self.state.value,
            "deliver_at": self.deliver_at_ms,
            "expires_at": self.expires_at_ms,
            "sent_at": self.sent_at_ms,
            "message_id": self.message_id,
            "correlation_id": self.correlation_id,
            "reply_to": self.reply_to,
            "report": sorted(r.value for r in self.report),
            "on_undeliverable": self.on_undeliverable.value,
            "headers": dict(self.headers),
            # A finished message keeps its metadata only (its body is dropped), so no size.
            "size": None if self.state in TERMINAL else len(self.body),
            "failures": self.failures,
            "last_error": self.last_error,
            "deaths": [d.to_dict() for d in self.deaths],
            "queue": self.queue,
            "redelivered": self.redelivered,
        }


NO_REPORT: frozenset[Report] = frozenset()


def reports_text(report: frozenset[Report]) -> str:
    """How stores keep a message's reports: their values, sorted, comma-separated ("" none)."""
    return ",".join(sorted(r.value for r in report))


def parse_reports(text: str | None) -> frozenset[Report]:
    """The reports ``reports_text`` wrote (the shared empty set when there are none)."""
    return frozenset(Report(r) for r in text.split(",") if r) if text else NO_REPORT


def plain_message(
    id: str,
    destination: str,
    body: bytes,
    sent_at_ms: int,
    deliver_at_ms: int,
    expires_at_ms: int | None,
    state: MessageState = MessageState.SCHEDULED,
    queue: str | None = None,
    enqueued_at_ms: int | None = None,
    queue_expires_at_ms: int | None = None,
    message_id: str | None = None,
    correlation_id: str | None = None,
) -> Message:
    """A ``Message`` with every optional field at its default but its producer's ids
    (``message_id``, ``correlation_id``), as ``Message(id=..., ..., updated_at_ms=sent_at_ms)``
    builds it (scheduled), or as entering ``queue`` at ``enqueued_at_ms`` then leaves it
    (ready; updated then), for the hot paths that build one per record read (a released
    batch). Every field is passed by position: a class called with keywords gets them through
    a dict, which makes the call several times dearer, once per message here. Keep it in the
    order of ``Message``'s fields."""
    return Message(
        id,
        destination,
        body,
        {},  # headers
        sent_at_ms,
        deliver_at_ms,
        expires_at_ms,
        state,
        message_id,
        correlation_id,
        None,  # reply_to
        NO_REPORT,
        Undeliverable.DEAD_LETTER,
        True,  # persistent
        None,  # topic
        0,  # failures
        None,  # last_error
        [],  # deaths
        queue,
        enqueued_at_ms,
        queue_expires_at_ms,
        False,  # redelivered
        0,  # delivery_count
        sent_at_ms if enqueued_at_ms is None else enqueued_at_ms,  # updated_at_ms
    )
