"""Fan-out: the messages one accepted send becomes. A queue (or route) gets the message itself;
a topic gives one copy per queue subscribed at send time (JMS: only subscriptions that exist when
the message is sent receive it), each carrying the topic's name.

The engine (at send time) and the pipeline's import (as of the import's start, in the executors)
both build their messages here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

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
    ids = [new_id(plan.sent_at_ms, plan.deliver_at_ms) for _ in targets]
    return _copies(
        [plan] * len(targets), [name for name, _ in targets], [t for _, t in targets], ids
    )


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
    plans = [plan for plan, _ in batch]
    # A batch names few destinations: their targets once each, not once per send.
    views = {id(view): view for _, view in batch}
    if not any(view is not None and view.kind == "topic" for view in views.values()):
        # One message a send, to its destination: columns of the plans, no copy list.
        dues = np.fromiter((plan.deliver_at_ms for plan in plans), np.int64, len(plans))
        messages = _copies(
            plans,
            [plan.request.destination for plan in plans],
            [None] * len(plans),
            _names(ids, sent_at_ms, dues),
        )
        return [[m] for m in messages]
    known: dict[tuple[str, int], list[tuple[str, str | None]]] = {}
    counts: list[int] = []
    copies: list[tuple[SendPlan, str, str | None]] = []
    for plan, view in batch:
        key = (plan.request.destination, id(view))
        pairs = known.get(key)
        if pairs is None:
            pairs = known[key] = targets_of(plan.request.destination, view)
        counts.append(len(pairs))
        copies += [(plan, name, topic) for name, topic in pairs]
    dues = np.array([plan.deliver_at_ms for plan, _, _ in copies], np.int64)
    messages = _copies(
        [plan for plan, _, _ in copies],
        [name for _, name, _ in copies],
        [topic for _, _, topic in copies],
        _names(ids, sent_at_ms, dues),
    )
    out = []
    start = 0
    for count in counts:
        out.append(messages[start : start + count])
        start += count
    return out


def _names(ids: IdGenerator, sent_at_ms: int, dues: np.ndarray) -> list[str]:
    return [b.decode("ascii") for b in ids.new_due_many(sent_at_ms, dues).tolist()]


_SCHEDULED = MessageState.SCHEDULED


def _copies(
    plans: Sequence[SendPlan],
    queues: Iterable[str],
    topics: Iterable[str | None],
    ids: Sequence[str],
) -> list[Message]:
    """The message of each plan to its queue (and topic, for a subscriber's copy), named by
    ``ids``, all in the same order."""
    # Positional up to ``topic``, in the field order of ``Message``: a batch makes thousands,
    # and sixteen keywords cost twice the call (tests/model/test_fanout.py pins every field).
    return [
        Message(
            message_id,
            name,
            plan.request.body,
            dict(plan.request.headers) if plan.request.headers else {},
            plan.sent_at_ms,
            plan.deliver_at_ms,
            plan.expires_at_ms,
            _SCHEDULED,
            plan.request.message_id,
            plan.request.correlation_id,
            plan.request.reply_to,
            plan.request.report,
            plan.request.on_undeliverable,
            plan.request.persistent,
            topic,
            updated_at_ms=plan.sent_at_ms,
        )
        for plan, name, topic, message_id in zip(plans, queues, topics, ids, strict=True)
    ]
