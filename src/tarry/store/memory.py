"""``MemoryStore``: an honest in-memory ``DelayedStore`` for unit tests, with failure injection
(``fail_next``) so breaker, retry and error-queue logic can be tested deterministically.
Nothing survives the process; it passes the same contract suite as the durable stores."""

from __future__ import annotations

import builtins
import heapq
from collections.abc import Sequence
from dataclasses import replace

from tarry.errors import NotCancellable, NotFound, TarryError, Unavailable
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState, transition
from tarry.store.base import StoreOutcome
from tarry.store.sqlite.store import decode_cursor, page

__all__ = ["MemoryStore"]


class MemoryStore:
    #: Local queues live in a queue database of their own (``tarry.store.base``).
    shares_queue_database = False

    def __init__(self) -> None:
        self._messages: dict[str, Message] = {}
        self._dedupe: dict[tuple[str | None, str, str], str] = {}
        #: (due, id) of scheduled messages; stale entries are skipped lazily.
        self._heap: list[tuple[int, str]] = []
        self._retry_at: dict[str, int] = {}
        self._claims: dict[str, int] = {}
        self._failures: list[TarryError] = []

    async def open(self) -> None:
        return None

    def fail_next(self, count: int = 1, error: TarryError | None = None) -> None:
        """The next ``count`` calls raise ``error`` (default ``Unavailable``)."""
        failure = error or Unavailable("injected store failure")
        self._failures.extend([failure] * count)

    def _maybe_fail(self) -> None:
        if self._failures:
            raise self._failures.pop(0)

    async def store(self, messages: Sequence[Message]) -> list[StoreOutcome]:
        self._maybe_fail()
        outcomes = []
        for message in messages:
            key = None
            if message.message_id is not None:
                key = (message.topic, message.destination, message.message_id)
                if key in self._dedupe:
                    kept = self._messages[self._dedupe[key]]
                    outcomes.append(StoreOutcome(replace(kept), False))
                    continue
                self._dedupe[key] = message.id
            self._messages[message.id] = replace(message)
            heapq.heappush(self._heap, (message.deliver_at_ms, message.id))
            outcomes.append(StoreOutcome(message, True))
        return outcomes

    def _scheduled(self, message_id: str, due: int) -> bool:
        message = self._messages.get(message_id)
        return (
            message is not None
            and message.state is MessageState.SCHEDULED
            and message.deliver_at_ms == due
        )

    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> list[Message]:
        self._maybe_fail()
        for message_id, until in list(self._claims.items()):
            if until <= now_ms:
                del self._claims[message_id]
        due: list[Message] = []
        skipped: list[tuple[int, str]] = []
        while self._heap and len(due) < limit and self._heap[0][0] <= now_ms:
            entry = heapq.heappop(self._heap)
            message_id = entry[1]
            if not self._scheduled(message_id, entry[0]):
                continue
            if message_id in self._claims or self._retry_at.get(message_id, 0) > now_ms:
                skipped.append(entry)
                continue
            skipped.append(entry)
            self._claims[message_id] = now_ms + lease_ms
            due.append(replace(self._messages[message_id]))
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return due

    async def probe(self) -> None:
        self._maybe_fail()

    async def next_due_time(self) -> int | None:
        self._maybe_fail()
        times = [
            max(due, self._retry_at.get(i, 0))
            for due, i in self._heap
            if self._scheduled(i, due) and i not in self._claims
        ]
        return min(times) if times else None

    def release_claims(self, ids: Sequence[str]) -> None:
        for message_id in ids:
            self._claims.pop(message_id, None)

    def hold_claims(self, ids: Sequence[str], *, until_ms: int) -> None:
        """Keep claimed messages back until ``until_ms`` without counting a failure (their
        destination is away); ``fetch_due`` returns them again after that."""
        for message_id in ids:
            if message_id in self._claims:
                self._claims[message_id] = until_ms

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        self._maybe_fail()
        removed = 0
        for message_id in ids:
            message = self._messages.get(message_id)
            self._claims.pop(message_id, None)
            if message is not None and message.state is MessageState.SCHEDULED:
                message.state, message.updated_at_ms = state, now_ms
                removed += 1
        return removed

    async def record_failure(self, message_id: str, *, error: str, retry_at_ms: int) -> int:
        self._maybe_fail()
        self._claims.pop(message_id, None)
        message = self._messages.get(message_id)
        if message is None or message.state is not MessageState.SCHEDULED:
            return 0
        message.failures += 1
        message.last_error = error
        self._retry_at[message_id] = retry_at_ms
        return message.failures

    def _get(self, message_id: str) -> Message:
        message = self._messages.get(message_id)
        if message is None:
            raise NotFound(f"no message with id {message_id}")
        if message_id in self._claims:
            raise NotCancellable(f"message {message_id} is being delivered right now")
        return message

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        self._maybe_fail()
        message = self._get(message_id)
        message.state = transition(message_id, message.state, MessageState.CANCELLED)
        message.updated_at_ms = now_ms
        return replace(message)

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        self._maybe_fail()
        message = self._get(message_id)
        if message.state is not MessageState.SCHEDULED:
            raise NotCancellable(f"message {message_id} is {message.state.value}; not scheduled")
        message.deliver_at_ms, message.updated_at_ms = deliver_at_ms, now_ms
        self._retry_at.pop(message_id, None)
        heapq.heappush(self._heap, (deliver_at_ms, message_id))
        return replace(message)

    async def get(self, message_id: str) -> Message | None:
        message = self._messages.get(message_id)
        return replace(message) if message else None

    async def list(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        after = decode_cursor(query.cursor) if query.cursor else None
        items = sorted(self._messages.values(), key=lambda m: (m.deliver_at_ms, m.id))
        selected = [replace(m) for m in items if query.matches(m, after)]
        return page(selected, query.limit)

    async def count_scheduled(self, destination: str | None = None) -> int:
        return sum(
            m.state is MessageState.SCHEDULED
            and (destination is None or m.destination == destination)
            for m in self._messages.values()
        )

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> builtins.list[int]:
        counts = [0] * max(buckets, 0)
        for m in self._messages.values():
            window = (m.deliver_at_ms - start_ms) // width_ms if width_ms > 0 else -1
            if m.state is MessageState.SCHEDULED and 0 <= window < buckets:
                counts[window] += 1
        return counts

    async def check(self) -> builtins.list[str]:
        return []

    async def close(self) -> None:
        return None
