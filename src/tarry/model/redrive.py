"""Redrive (SQS's word; Service Bus "resubmit", Sidekiq "retry"): what a request to send dead
letters back may say, and what a moved message looks like. Pure: the queue transaction that
moves them is ``tarry.queues.redrive``, the order across stores ``tarry.engine.redrive``.

A dead letter goes back to where it last died: ``deaths[0]``'s destination (the queue it expired
in or was rejected from, or the route that refused it), or to the request's ``to``. The moved
message is a new message (new ``id``) that keeps the dead letter's body, headers and ``deaths``
and adds the header ``tarry-redriven-from`` = the dead letter's id.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from tarry.errors import InvalidArgument
from tarry.model.message import MAX_DELAY_MS, DeathReason, Message
from tarry.model.state import MessageState
from tarry.model.time import parse_instant_ms
from tarry.model.validate import check_name

__all__ = [
    "REDRIVEN_FROM",
    "REDRIVEN_TO",
    "RedriveCursor",
    "RedriveRequest",
    "parse_redrive",
    "redriven_copy",
]

#: The header a moved message carries: the id of the dead letter it was made from.
REDRIVEN_FROM = "tarry-redriven-from"
#: The header the dead letter's own record gets: the id of the message it became.
REDRIVEN_TO = "tarry-redriven-to"

#: Most messages one request moves (``max``), and its default.
MAX_PER_REQUEST = 10_000
DEFAULT_MAX = 1_000
#: Most ids one request names.
MAX_IDS = 1_000
_FIELDS = frozenset(
    {
        "ids",
        "original_destination",
        "reason",
        "dead_after",
        "dead_before",
        "to",
        "delay_ms",
        "max",
        "cursor",
    }
)


@dataclass(frozen=True, slots=True)
class RedriveCursor:
    """Where the next request of a long redrive goes on: after queue position ``after_seq``,
    up to ``upper_seq`` (the queue's last position when the first request ran, so that what
    dies again meanwhile is not moved round and round)."""

    after_seq: int
    upper_seq: int

    def encode(self) -> str:
        return base64.urlsafe_b64encode(orjson.dumps([self.after_seq, self.upper_seq])).decode()

    @classmethod
    def decode(cls, text: object) -> RedriveCursor:
        try:
            if not isinstance(text, str):
                raise ValueError(text)
            after, upper = orjson.loads(base64.urlsafe_b64decode(text.encode("ascii")))
            # Queue positions are SQLite integers: 0 up to 2^63 - 1.
            if not all(type(v) is int and 0 <= v < 1 << 63 for v in (after, upper)):
                raise ValueError(text)
            return cls(after, upper)
        except (ValueError, TypeError, UnicodeEncodeError, binascii.Error, orjson.JSONDecodeError):
            raise InvalidArgument(
                "cursor is not one this server handed out; start the redrive again without it"
            ) from None


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    """A checked redrive request; ``ids`` None means every dead letter the filters let through."""

    ids: tuple[str, ...] | None = None
    original_destination: str | None = None
    reason: DeathReason | None = None
    dead_after_ms: int | None = None
    dead_before_ms: int | None = None
    to: str | None = None
    delay_ms: int = 0
    max: int = DEFAULT_MAX
    cursor: RedriveCursor | None = None

    def target_of(self, message: Message) -> str | None:
        """Where ``message`` goes back to (None: it is no dead letter, so it has no origin)."""
        if not message.deaths:
            return None
        return self.to or message.deaths[0].destination

    def matches(self, message: Message) -> bool:
        """Whether the filters let ``message`` through: its latest death's destination and
        reason, and the time of that death (``dead_after`` inclusive, ``dead_before`` not)."""
        if not message.deaths:
            return False
        death = message.deaths[0]
        return (
            (self.original_destination is None or death.destination == self.original_destination)
            and (self.reason is None or death.reason is self.reason)
            and (self.dead_after_ms is None or death.time_ms >= self.dead_after_ms)
            and (self.dead_before_ms is None or death.time_ms < self.dead_before_ms)
        )


def _whole(data: Mapping[str, Any], key: str, low: int, high: int, default: int) -> int:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{key} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _ids(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(i, str) and 0 < len(i) <= 100 for i in value)
    ):
        raise InvalidArgument("ids must be a non-empty list of message ids (strings)")
    if len(value) > MAX_IDS:
        raise InvalidArgument(
            f"ids names {len(value)} messages; at most {MAX_IDS} a request, send the rest next"
        )
    return tuple(dict.fromkeys(value))


def _reason(value: Any) -> DeathReason | None:
    if value is None:
        return None
    try:
        return DeathReason(value)
    except ValueError:
        choices = ", ".join(r.value for r in DeathReason)
        raise InvalidArgument(
            f"reason {value!r} is not a death reason; use one of {choices}"
        ) from None


def parse_redrive(data: Mapping[str, Any]) -> RedriveRequest:
    """Check a ``POST /v1/queues/{name}/redrive`` body (every entry point calls this)."""
    unknown = set(data) - _FIELDS
    if unknown:
        raise InvalidArgument(
            f"unknown field(s) {', '.join(sorted(unknown))}; a redrive takes "
            f"{', '.join(sorted(_FIELDS))}"
        )
    after = data.get("dead_after")
    before = data.get("dead_before")
    destination = data.get("original_destination")
    to = data.get("to")
    cursor = data.get("cursor")
    request = RedriveRequest(
        ids=_ids(data.get("ids")),
        original_destination=None
        if destination is None
        else check_name(destination, field="original_destination"),
        reason=_reason(data.get("reason")),
        dead_after_ms=None if after is None else parse_instant_ms(after, field="dead_after"),
        dead_before_ms=None if before is None else parse_instant_ms(before, field="dead_before"),
        to=None if to is None else check_name(to, field="to"),
        delay_ms=_whole(data, "delay_ms", 0, MAX_DELAY_MS, 0),
        max=_whole(data, "max", 1, MAX_PER_REQUEST, DEFAULT_MAX),
        cursor=None if cursor is None else RedriveCursor.decode(cursor),
    )
    if request.ids is not None and request.cursor is not None:
        raise InvalidArgument("give ids or a cursor, not both (a cursor goes on with a filter)")
    return request


def redriven_copy(
    dead: Message, *, new_id: str, destination: str, now_ms: int, deliver_at_ms: int
) -> Message:
    """The message a dead letter becomes: a new id, scheduled for ``deliver_at_ms`` to
    ``destination``, its body, headers and ``deaths`` kept, linked to the dead letter by the
    ``tarry-redriven-from`` header. It carries no expiry (dead-lettering removed it, as in
    RabbitMQ)."""
    headers = {**dead.headers, REDRIVEN_FROM: dead.id}
    headers.pop(REDRIVEN_TO, None)
    return replace(
        dead,
        id=new_id,
        destination=destination,
        headers=headers,
        state=MessageState.SCHEDULED,
        sent_at_ms=now_ms,
        deliver_at_ms=deliver_at_ms,
        expires_at_ms=None,
        deaths=list(dead.deaths),
        topic=None,
        failures=0,
        last_error=None,
        queue=None,
        enqueued_at_ms=None,
        queue_expires_at_ms=None,
        redelivered=False,
        delivery_count=0,
        updated_at_ms=now_ms,
    )
