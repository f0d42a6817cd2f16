"""Events: what a message's state change tells its listeners (the journal, the metrics). The
queues, the dispatcher and the engine make them; listeners take them a batch at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tarry.model.message import Message

__all__ = ["Event", "EventBatchListener", "EventListener"]

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
