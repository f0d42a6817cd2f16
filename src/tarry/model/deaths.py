"""Death records, kept as RabbitMQ keeps ``x-death``: one per (queue, reason), newest first."""

from __future__ import annotations

from tarry.model.message import Death, DeathReason

__all__ = ["record_death", "would_cycle"]


def record_death(
    deaths: list[Death], *, reason: DeathReason, queue: str, now_ms: int, destination: str
) -> list[Death]:
    """A new list with this death counted: an existing (queue, reason) entry gets ``count + 1``
    and moves to the front, keeping the time of its first death."""
    for i, death in enumerate(deaths):
        if death.queue == queue and death.reason is reason:
            bumped = Death(reason, queue, death.time_ms, death.count + 1, death.destination)
            return [bumped, *deaths[:i], *deaths[i + 1 :]]
    return [Death(reason, queue, now_ms, 1, destination), *deaths]


def would_cycle(deaths: list[Death], target_queue: str) -> bool:
    """RabbitMQ drops a message that would return to a queue it already died in when no death
    in the cycle was a rejection; tarry refuses that hop the same way."""
    if not any(d.queue == target_queue for d in deaths):
        return False
    return not any(d.reason is DeathReason.REJECTED for d in deaths)
