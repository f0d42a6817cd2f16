"""Events: what a message's state change tells its listeners (the journal, the metrics). The
queues, the dispatcher and the engine make them; listeners take them a batch at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import overload

from tarry.model.lazy_messages import LazyMessages
from tarry.model.message import Message

__all__ = ["Event", "EventBatchListener", "EventListener", "EventRun"]

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


_DUE = attrgetter("deliver_at_ms")


class EventRun(Sequence[Event]):
    """The same event at the same time (same queue, same reason) for many messages: a batch's
    change told as one object. It is a sequence of ``Event``s for any listener; one that knows
    the form counts a run at once (``len``) and reads ``messages`` without a tuple per event."""

    __slots__ = ("_late_ms", "event", "messages", "queue", "reason", "time_ms")

    def __init__(
        self,
        event: str,
        messages: Sequence[Message],
        time_ms: int,
        queue: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.event = event
        self.messages = messages
        self.time_ms = time_ms
        self.queue = queue
        self.reason = reason
        self._late_ms: list[int] | None = None

    def late_ms(self) -> list[int]:
        """Each message's lateness in ms (``time_ms`` - its due time; 0 when early), in order:
        worked out once for every listener that counts it (the metrics, the recent activity)."""
        late = self._late_ms
        if late is None:
            time_ms = self.time_ms
            messages = self.messages
            # A batch kept as columns tells its due times without a ``Message`` each.
            due_ms = (
                messages.due_times() if isinstance(messages, LazyMessages) else map(_DUE, messages)
            )
            late = [time_ms - due for due in due_ms]
            if late and min(late) < 0:
                late = [value if value > 0 else 0 for value in late]
            self._late_ms = late
        return late

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> EventRun: ...

    def __getitem__(self, index: int | slice) -> Event | EventRun:
        if isinstance(index, slice):
            return EventRun(self.event, self.messages[index], self.time_ms, self.queue, self.reason)
        return (self.event, self.messages[index], self.time_ms, self.queue, self.reason)

    def __iter__(self) -> Iterator[Event]:
        event, time_ms, queue, reason = self.event, self.time_ms, self.queue, self.reason
        for message in self.messages:
            yield (event, message, time_ms, queue, reason)

    def __repr__(self) -> str:
        return f"EventRun({self.event!r}, {len(self)} messages, time_ms={self.time_ms})"
