"""Value types the engine returns to its edges (the HTTP server, the AMQP ingress, the pipeline).
The types the layers below share (``MessageQuery``, ``Event``) live in ``tarry.model``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tarry.model.message import Message
from tarry.model.queue_args import EffectiveQueueArgs, QueueArgs

__all__ = ["Delivery", "MayAccess", "QueueInfo", "SendResult"]

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


# Not frozen: a receive makes one per message, and a frozen dataclass's __init__
# (object.__setattr__ per field) costs more than twice a plain one's.
@dataclass(slots=True)
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
