"""Fan-out: the messages one accepted send becomes. A queue (or route) gets the message itself;
a topic gives one copy per queue subscribed at send time (JMS: only subscriptions that exist when
the message is sent receive it), each carrying the topic's name.

The engine (at send time) and the pipeline's import (as of the import's start, in the executors)
both build their messages here."""

from __future__ import annotations

from collections.abc import Callable

from tarry.model.message import Message, SendPlan
from tarry.model.state import MessageState
from tarry.model.validate import DestinationView

__all__ = ["fan_out", "targets_of"]


def targets_of(destination: str, view: DestinationView | None) -> list[tuple[str, str | None]]:
    """(queue, topic) pairs a send to ``destination`` lands in."""
    if view is not None and view.kind == "topic":
        return [(t.name, destination) for t in view.targets]
    return [(destination, None)]


def fan_out(
    plan: SendPlan, view: DestinationView | None, new_id: Callable[[int, int], str]
) -> list[Message]:
    """One message, or one staged copy per subscriber of a topic; ``new_id(sent_at_ms,
    deliver_at_ms)`` names each (``IdGenerator.new_due``)."""
    request = plan.request
    return [
        Message(
            id=new_id(plan.sent_at_ms, plan.deliver_at_ms),
            destination=name,
            topic=topic,
            body=request.body,
            headers=dict(request.headers),
            sent_at_ms=plan.sent_at_ms,
            deliver_at_ms=plan.deliver_at_ms,
            expires_at_ms=plan.expires_at_ms,
            state=MessageState.SCHEDULED,
            message_id=request.message_id,
            correlation_id=request.correlation_id,
            reply_to=request.reply_to,
            report=request.report,
            on_undeliverable=request.on_undeliverable,
            persistent=request.persistent,
            updated_at_ms=plan.sent_at_ms,
        )
        for name, topic in targets_of(request.destination, view)
    ]
