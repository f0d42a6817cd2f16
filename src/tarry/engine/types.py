"""Value types the engine returns to its edges (the HTTP server, the AMQP ingress, the pipeline)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tarry.model.message import Message
from tarry.model.queue_args import EffectiveQueueArgs, QueueArgs

__all__ = [
    "Delivery",
    "Event",
    "EventBatchListener",
    "EventListener",
    "MayAccess",
    "MessageQuery",
    "QueueInfo",
    "SendResult",
]

#: A permission check: does the caller's token allow this action on that name?
MayAccess = Callable[[str], bool]


# Not frozen: a batch makes one per send (see SendPlan).
@dataclass(slots=True)
class SendResult:
    """The answer to one accepted send."""

    id: str
    state: str
    deliver_at_ms: int
    expires_at_ms: int | None
    #: False when a repeated ``message_id`` matched an earlier message: nothing was stored.
    created: bool = True
    destination: str = ""
    #: For a topic: one (id, queue) per subscriber copy made at send time.
    copies: tuple[tuple[str, str], ...] = ()

    def to_public(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "deliver_at": self.deliver_at_ms,
            "expires_at": self.expires_at_ms,
        }
        if not self.created:
            data["duplicate"] = True
        if self.copies:
            data["copies"] = [{"id": i, "queue": q} for i, q in self.copies]
        return data


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed to a consumer by ``receive``; ``receipt`` acks or nacks it."""

    message: Message
    receipt: str

    def to_public(self) -> dict[str, Any]:
        m = self.message
        text = m.body_text
        data: dict[str, Any] = {
            "id": m.id,
            "receipt": self.receipt,
            "body": text,
            "headers": dict(m.headers),
            "deliver_at": m.deliver_at_ms,
            "expires_at": m.expires_at_ms,
            "sent_at": m.sent_at_ms,
            "message_id": m.message_id,
            "correlation_id": m.correlation_id,
            "redelivered": m.redelivered,
            "delivery_count": m.delivery_count,
            "deaths": [d.to_dict() for d in m.deaths],
        }
        if text is None:
            data["body_base64"] = m.body_base64
        return data


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    args: QueueArgs
    effective: EffectiveQueueArgs
    ready: int
    in_flight: int
    scheduled: int
    consumers_waiting: int
    created_at_ms: int
    last_used_ms: int

    def to_public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ready": self.ready,
            "in_flight": self.in_flight,
            "scheduled": self.scheduled,
            "consumers_waiting": self.consumers_waiting,
            "arguments": self.args.to_dict(),
            "effective": self.effective.to_dict(),
            "created_at": self.created_at_ms,
            "last_used": self.last_used_ms,
        }


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """Filters of ``GET /v1/messages``; results are ordered by (deliver_at, id)."""

    destination: str | None = None
    correlation_id: str | None = None
    message_id: str | None = None
    state: str | None = None
    due_after_ms: int | None = None
    due_before_ms: int | None = None
    limit: int = 100
    #: Opaque: the (deliver_at, id) after which the next page starts.
    cursor: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def matches(self, m: Message, after: tuple[int, str] | None = None) -> bool:
        """Whether ``m`` passes the filters and comes after the decoded cursor ``after``."""
        return (
            (self.destination is None or m.destination == self.destination)
            and (self.correlation_id is None or m.correlation_id == self.correlation_id)
            and (self.message_id is None or m.message_id == self.message_id)
            and (self.state is None or m.state.value == self.state)
            and (self.due_after_ms is None or m.deliver_at_ms >= self.due_after_ms)
            and (self.due_before_ms is None or m.deliver_at_ms < self.due_before_ms)
            and (after is None or (m.deliver_at_ms, m.id) > after)
        )


#: Called synchronously for every state change, after it is durable:
#: ``listener(event, message, time_ms, queue, reason)``. Events: ``scheduled``, ``released``,
#: ``received``, ``acked``, ``nacked``, ``expired``, ``dead_lettered``, ``cancelled``,
#: ``rescheduled``, ``failed``, ``delivered`` (accepted by an external destination),
#: ``redriven`` (a dead letter moved back by a redrive; reason: the new message's id).
#: Listeners must be fast and must not raise (the journal and the metrics are listeners).
EventListener = Callable[[str, Message, int, "str | None", "str | None"], None]
#: One event as ``EventListener`` takes it: ``(event, message, time_ms, queue, reason)``.
Event = tuple[str, Message, int, "str | None", "str | None"]
#: A listener's form for many events at once, in order (a batch makes one event a message).
EventBatchListener = Callable[[Sequence[Event]], None]
