"""When a message stops being deliverable.

Expiry counts from the send (JMS, IBM MQ), through the delay and the queue. Once the message
reaches a queue, that queue's ``message_ttl_ms`` also runs from the moment of arrival, and the
earlier of the two wins (RabbitMQ). A message whose expiry has come is never handed to a consumer;
a requeued message keeps the expiry it had.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["is_expired", "queue_expiries_ms", "queue_expiry_ms"]


def queue_expiry_ms(
    message_expires_at_ms: int | None, *, enqueued_at_ms: int, queue_ttl_ms: int | None
) -> int | None:
    """The instant a message that entered a queue at ``enqueued_at_ms`` expires there."""
    queue_expiry = None if queue_ttl_ms is None else enqueued_at_ms + queue_ttl_ms
    if message_expires_at_ms is None:
        return queue_expiry
    if queue_expiry is None:
        return message_expires_at_ms
    return min(message_expires_at_ms, queue_expiry)


def is_expired(expires_at_ms: int | None, now_ms: int) -> bool:
    """True from the expiry instant on (TTL 0: expired on arrival unless handed over at once)."""
    return expires_at_ms is not None and now_ms >= expires_at_ms


def queue_expiries_ms(
    message_expires_at_ms: Sequence[int | None], *, enqueued_at_ms: int, queue_ttl_ms: int | None
) -> list[int | None]:
    """``queue_expiry_ms`` of a column of messages entering one queue together (a released
    batch): the queue's TTL counts from the same instant for all of them."""
    if queue_ttl_ms is None:
        return list(message_expires_at_ms)
    cap = enqueued_at_ms + queue_ttl_ms
    return [cap if e is None else min(e, cap) for e in message_expires_at_ms]
