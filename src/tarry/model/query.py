"""``MessageQuery``: the filters of ``GET /v1/messages``, shared by the engine and every store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tarry.errors import InvalidArgument
from tarry.model.message import Message
from tarry.model.state import MessageState

__all__ = ["MessageQuery"]


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """Filters of ``GET /v1/messages``; results are ordered by (deliver_at, id)."""

    destination: str | None = None
    correlation_id: str | None = None
    message_id: str | None = None
    state: str | None = None
    due_after_ms: int | None = None
    due_before_ms: int | None = None
    limit: int = 100
    #: Opaque: the (deliver_at, id) after which the next page starts.
    cursor: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A misspelt state would match nothing and read as "no such messages".
        states = [s.value for s in MessageState]
        if self.state is not None and self.state not in states:
            raise InvalidArgument(
                f"state {self.state!r} is not a message state; use one of {', '.join(states)}"
            )

    def matches(self, m: Message, after: tuple[int, str] | None = None) -> bool:
        """Whether ``m`` passes the filters and comes after the decoded cursor ``after``."""
        return (
            (self.destination is None or m.destination == self.destination)
            and (self.correlation_id is None or m.correlation_id == self.correlation_id)
            and (self.message_id is None or m.message_id == self.message_id)
            and (self.state is None or m.state.value == self.state)
            and (self.due_after_ms is None or m.deliver_at_ms >= self.due_after_ms)
            and (self.due_before_ms is None or m.deliver_at_ms < self.due_before_ms)
            and (after is None or (m.deliver_at_ms, m.id) > after)
        )
