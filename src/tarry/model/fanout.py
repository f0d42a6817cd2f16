"""Fan-out: the messages one accepted send becomes. A queue (or route) gets the message itself;
a topic gives one copy per queue subscribed at send time (JMS: only subscriptions that exist when
the message is sent receive it), each carrying the topic's name.

The engine (at send time) and the pipeline's import (as of the import's start, in the executors)
both build their messages here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tarry.model.ids import IdGenerator
from tarry.model.message import Message, SendPlan
from tarry.model.state import MessageState
from tarry.model.validate import DestinationView

__all__ = ["fan_out", "fan_out_many", "targets_of"]


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
    targets = targets_of(plan.request.destination, view)
    return _copies(plan, targets, [new_id(plan.sent_at_ms, plan.deliver_at_ms) for _ in targets])


def fan_out_many(
    batch: Sequence[tuple[SendPlan, DestinationView | None]], ids: IdGenerator
) -> list[list[Message]]:
    """``fan_out`` of every plan of a batch, in order. Plans sent at the same time (one
    request's) get all their ids from one ``IdGenerator.new_due_many`` call (numpy: worth it
    from a few dozen ids on)."""
    if not batch:
        return []
    sent_at_ms = batch[0][0].sent_at_ms
    if len(batch) < 32 or any(plan.sent_at_ms != sent_at_ms for plan, _ in batch):
        return [fan_out(plan, view, ids.new_due) for plan, view in batch]
    # A batch names few destinations: their targets once each, not once per send.
    known: dict[tuple[str, int], list[tuple[str, str | None]]] = {}
    targets = []
    for plan, view in batch:
        key = (plan.request.destination, id(view))
        pairs = known.get(key)
        if pairs is None:
            pairs = known[key] = targets_of(plan.request.destination, view)
        targets.append(pairs)
    dues = [
        plan.deliver_at_ms for (plan, _), pairs in zip(batch, targets, strict=True) for _ in pairs
    ]
    names = [
        b.decode("ascii") for b in ids.new_due_many(sent_at_ms, np.array(dues, np.int64)).tolist()
    ]
    out = []
    start = 0
    for (plan, _), pairs in zip(batch, targets, strict=True):
        out.append(_copies(plan, pairs, names[start : start + len(pairs)]))
        start += len(pairs)
    return out


_SCHEDULED = MessageState.SCHEDULED


def _copies(plan: SendPlan, targets: list[tuple[str, str | None]], ids: list[str]) -> list[Message]:
    request = plan.request
    headers = request.headers
    # Positional up to ``topic``, in the field order of ``Message``: a batch makes thousands,
    # and sixteen keywords cost twice the call (tests/model/test_fanout.py pins every field).
    return [
        Message(
            message_id,
            name,
            request.body,
            dict(headers) if headers else {},
            plan.sent_at_ms,
            plan.deliver_at_ms,
            plan.expires_at_ms,
            _SCHEDULED,
            request.message_id,
            request.correlation_id,
            request.reply_to,
            request.report,
            request.on_undeliverable,
            request.persistent,
            topic,
            updated_at_ms=plan.sent_at_ms,
        )
        for (name, topic), message_id in zip(targets, ids, strict=True)
    ]
