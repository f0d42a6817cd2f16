"""The delayed-message store contract, shaped after NServiceBus's ``IDelayedMessageStore``
(store / fetch-next-due / next-due-time / remove / count-failure), made batch-shaped so that
throughput does not die on per-message round trips.

Guarantees every implementation gives (``tests/contract/test_store_contract.py`` checks them):

- ``store`` returns only once the messages are durable (per the store's durability setting);
  a message whose (destination, ``message_id``) is already kept is not stored again, and the
  kept one is returned with ``created=False``.
- ``fetch_due`` returns messages due at or before ``now_ms`` (never one due later), oldest due
  first, and claims them: until the claim is released (``remove``, ``record_failure``, or the
  lease ending) no other ``fetch_due`` returns them. A claim does not survive the process.
- ``remove`` finishes claimed messages; ``cancel``/``reschedule`` refuse claimed ones.
- Every method raises ``Unavailable`` when the store cannot do it now, and nothing is changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tarry.engine.types import MessageQuery
from tarry.model.message import Message
from tarry.model.state import MessageState

__all__ = ["DelayedStore", "StoreOutcome"]


@dataclass(frozen=True, slots=True)
class StoreOutcome:
    message: Message
    #: False when an earlier message with the same (destination, message_id) was returned.
    created: bool


class DelayedStore(Protocol):
    async def store(self, messages: Sequence[Message]) -> list[StoreOutcome]:
        """Durably keep ``messages`` (state ``scheduled``) in one commit. Raises ``Unavailable``."""
        ...

    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> list[Message]:
        """Claim up to ``limit`` messages with ``deliver_at_ms <= now_ms``, oldest due first."""
        ...

    async def next_due_time(self) -> int | None:
        """When the earliest unclaimed scheduled message falls due (None when there is none)."""
        ...

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        """Finish claimed messages with ``state`` (delivered, expired, dead_lettered); returns how
        many were still there (fewer means another path already finished them)."""
        ...

    async def record_failure(self, message_id: str, *, error: str, retry_at_ms: int) -> int:
        """Count a failed delivery, release the claim, and keep the message back until
        ``retry_at_ms``; returns the new failure count (0 when the message is gone)."""
        ...

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        """Cancel a scheduled message. Raises ``not_found``, ``not_cancellable``."""
        ...

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        """Move a scheduled message's due time. Raises ``not_found``, ``not_cancellable``."""
        ...

    async def get(self, message_id: str) -> Message | None: ...

    async def list(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        """Messages matching ``query`` ordered by (deliver_at, id), and the next page's cursor."""
        ...

    async def count_scheduled(self) -> int: ...

    async def close(self) -> None: ...
