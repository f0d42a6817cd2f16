"""Hand-over at send time, for routes whose broker does the waiting (RabbitMQ ``mode =
"native"``): the message is published into the delay topology *before* tarry records it, and
the record is kept in state ``delivered`` (inspectable, de-duplicating, but not cancellable).

Order and what it guarantees:

1. a repeated (destination, ``message_id``) already recorded is not published again;
2. publish with publisher confirms; if RabbitMQ does not confirm, the producer gets
   ``unavailable`` and nothing was scheduled anywhere;
3. the record is written; if tarry crashes between 2 and 3 the producer never heard "accepted"
   and a retry publishes again (at-least-once, like every external destination).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tarry.errors import DeliveryFailed, NotCancellable, TarryError, Unavailable
from tarry.model.message import Message, SendPlan
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState
from tarry.transports.base import Transport

__all__ = ["Accepted", "hand_over", "holds_waiting", "refuse_if_handed_over"]

Accepted = tuple[int, SendPlan, list[Message]]


def holds_waiting(transport: Transport | None) -> bool:
    return bool(getattr(transport, "holds_waiting", False))


def refuse_if_handed_over(message: Message, transports: Mapping[str, Transport]) -> None:
    """Cancel and reschedule of a message RabbitMQ holds: ``not_cancellable``, saying why."""
    if holds_waiting(transports.get(message.destination)):
        raise NotCancellable(
            f"message {message.id} was handed to RabbitMQ's delay topology at send time "
            f"(route {message.destination!r}, mode native); RabbitMQ holds it until it is due "
            "and tarry cannot cancel or reschedule it. Use a route with mode = store for "
            "cancellable messages"
        )


async def hand_over(
    accepted: Sequence[Accepted],
    results: list[Any],
    *,
    transports: Mapping[str, Transport],
    find: Callable[[MessageQuery], Awaitable[tuple[list[Message], str | None]]],
) -> list[Accepted]:
    """Publish the messages of native routes (concurrently); returns what is left to record.
    An item that fails gets its error in ``results`` and is dropped from the rest. ``find`` is
    the engine's listing (wherever the store keeps its records: the delayed store, or the queue
    database beside it)."""
    if not any(holds_waiting(t) for t in transports.values()) or not any(
        holds_waiting(transports.get(m.destination)) for _, _, ms in accepted for m in ms
    ):
        return list(accepted)

    async def one(item: Accepted) -> TarryError | None:
        _, plan, messages = item
        native = [m for m in messages if holds_waiting(transports.get(m.destination))]
        if not native:
            return None
        if plan.request.message_id is not None:
            kept, _ = await find(
                MessageQuery(
                    destination=native[0].destination,
                    message_id=plan.request.message_id,
                    limit=1,
                )
            )
            if kept:
                return None  # recording returns the first message; nothing is published twice
        try:
            for message in native:
                await transports[message.destination].deliver(message)
                message.state = MessageState.DELIVERED
        except DeliveryFailed as exc:
            return Unavailable(
                f"RabbitMQ did not take the message for {native[0].destination!r} "
                f"({exc.reason}: {exc.message}); nothing was scheduled, retry later"
            )
        except TarryError as exc:
            return exc
        return None

    outcomes = await asyncio.gather(*(one(item) for item in accepted))
    left = []
    for item, error in zip(accepted, outcomes, strict=True):
        if error is None:
            left.append(item)
        else:
            results[item[0]] = error
    return left
