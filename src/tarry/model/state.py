"""Message states and the one table of allowed transitions."""

from __future__ import annotations

from enum import StrEnum

from tarry.errors import NotCancellable

__all__ = ["ALLOWED", "MessageState", "transition"]


class MessageState(StrEnum):
    #: Held in the delayed store until ``deliver_at``.
    SCHEDULED = "scheduled"
    #: Released into a local queue, waiting for a consumer.
    READY = "ready"
    #: Handed to a consumer (in flight, invisible until acked or the visibility timeout ends),
    #: or accepted by an external destination.
    DELIVERED = "delivered"
    #: Acknowledged by the consumer: done.
    ACKED = "acked"
    #: Cancelled by the producer while scheduled: never released.
    CANCELLED = "cancelled"
    #: Its time-to-live (message or queue) ended before a consumer took it.
    EXPIRED = "expired"
    #: Moved to a dead-letter queue (rejected, expired, maxlen, delivery_failed), or discarded.
    DEAD_LETTERED = "dead_lettered"


S = MessageState

ALLOWED: dict[MessageState, frozenset[MessageState]] = {
    S.SCHEDULED: frozenset({S.READY, S.DELIVERED, S.CANCELLED, S.EXPIRED, S.DEAD_LETTERED}),
    # ready → acked: a dead letter redriven out of its queue (``tarry.queues.redrive``).
    S.READY: frozenset({S.DELIVERED, S.ACKED, S.EXPIRED, S.DEAD_LETTERED}),
    S.DELIVERED: frozenset({S.READY, S.ACKED, S.DEAD_LETTERED}),
    S.ACKED: frozenset(),
    S.CANCELLED: frozenset(),
    S.EXPIRED: frozenset(),
    S.DEAD_LETTERED: frozenset(),
}

TERMINAL: frozenset[MessageState] = frozenset(s for s, nxt in ALLOWED.items() if not nxt)


def transition(message_id: str, current: MessageState, target: MessageState) -> MessageState:
    """Check that ``current → target`` is allowed; raise ``not_cancellable`` when it is not."""
    if target in ALLOWED[current]:
        return target
    if target is S.CANCELLED:
        raise NotCancellable(
            f"message {message_id} is {current.value}, not scheduled; only scheduled messages "
            "can be cancelled"
        )
    raise NotCancellable(
        f"message {message_id} is {current.value}; it cannot become {target.value}"
    )
