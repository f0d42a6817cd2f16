"""``ReleasePath``: how due messages reach their local queues, and what that means for reading
and changing one message. Picked once, where the engine is built (``pick``), from the store's
``shares_queue_database``:

- ``SharedPath`` (SQLite, PostgreSQL ``exactly_once``): a scheduled message is a row of the
  queue database; a release is one transaction (``tarry.engine.shared_release``), and the store
  alone answers for a message.
- ``SeparatePath`` (the log store, the memory store, PostgreSQL ``at_least_once``): the queue
  database is opened beside the store; a release inserts into the queue, then the store writes
  its marker (``tarry.engine.release``), so a released message is looked up in the queue
  database first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tarry.engine import release, shared_release
from tarry.engine.context import EngineContext
from tarry.engine.release import Accepted
from tarry.errors import DeliveryFailed
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState
from tarry.queues import counts
from tarry.queues.txn import QueueTxn
from tarry.store.base import StoreOutcome

__all__ = ["ReleasePath", "SeparatePath", "SharedPath", "pick"]


class ReleasePath(Protocol):
    async def open(self) -> None:
        """Open what the path needs besides the store. Raises ``Unavailable``."""
        ...

    async def close(self) -> None: ...

    async def released(self, message_id: str) -> Message | None:
        """The record of ``message_id`` once released, where the store no longer answers for
        it (None: ask the store)."""
        ...

    async def refuse_if_released(self, message_id: str) -> None:
        """Raises ``not_cancellable`` for a message already released (cancel, reschedule)."""
        ...

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        """Messages matching ``query``, scheduled and released alike (``DelayedStore.list``)."""
        ...

    async def release(self, batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        """Release claimed messages into their local queues, each once; returns those their
        queue refused (still claimed by the dispatcher's round)."""
        ...

    def release_at_once(self, batch: Sequence[Message]) -> bool:
        """Release claimed messages into local queues kept in memory, with nothing to wait
        for; False, with nothing done, where they take ``release``."""
        ...

    async def give_up(self, message: Message, error: DeliveryFailed) -> None:
        """Dead-letter (or discard) a claimed message that cannot be delivered."""
        ...

    async def keep_sends(
        self, accepted: Accepted, now_ms: int
    ) -> tuple[QueueTxn | None, list[StoreOutcome]]:
        """Keep accepted sends durably and release at once those not delayed to a local queue.
        Returns the release's transaction (its events are told after "scheduled") and one
        outcome per message, in order."""
        ...

    async def counts_by_state(self) -> dict[str, int]:
        """How many messages are in each state (by ``MessageState`` value), for ``/v1/stats``."""
        ...


class SharedPath:
    def __init__(self, ctx: EngineContext, still_held: shared_release.StillHeld) -> None:
        self._ctx = ctx
        self._still_held = still_held

    async def open(self) -> None:
        """Nothing: the store is the queue database."""

    async def close(self) -> None:
        """Nothing: the store is the queue database."""

    async def released(self, message_id: str) -> Message | None:
        return None  # the store's row is the message, before and after release

    async def refuse_if_released(self, message_id: str) -> None:
        """Nothing: the store refuses a message that is no longer scheduled."""

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        return await self._ctx.store.list(query)

    async def release(self, batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        return await shared_release.release(self._ctx, batch, self._still_held)

    def release_at_once(self, batch: Sequence[Message]) -> bool:
        return False  # the release is the store's transaction

    async def give_up(self, message: Message, error: DeliveryFailed) -> None:
        await shared_release.give_up(self._ctx, message, error)

    async def keep_sends(
        self, accepted: Accepted, now_ms: int
    ) -> tuple[QueueTxn | None, list[StoreOutcome]]:
        return await shared_release.store_sends(self._ctx, accepted, now_ms)

    async def counts_by_state(self) -> dict[str, int]:
        return await self._ctx.qdb.read(counts.by_state)  # scheduled rows included


class SeparatePath:
    def __init__(self, ctx: EngineContext) -> None:
        self._ctx = ctx

    async def open(self) -> None:
        await self._ctx.qdb.open()

    async def close(self) -> None:
        await self._ctx.qdb.close()

    async def released(self, message_id: str) -> Message | None:
        return await release.get_released(self._ctx, message_id)

    async def refuse_if_released(self, message_id: str) -> None:
        await release.refuse_if_released(self._ctx, message_id)

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        return await release.list_merged(self._ctx, query)

    async def release(self, batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        return await release.release(self._ctx, batch)

    def release_at_once(self, batch: Sequence[Message]) -> bool:
        memory = self._ctx.memory
        return memory is not None and memory.release(batch)

    async def give_up(self, message: Message, error: DeliveryFailed) -> None:
        await release.give_up(self._ctx, message, error)

    async def keep_sends(
        self, accepted: Accepted, now_ms: int
    ) -> tuple[QueueTxn | None, list[StoreOutcome]]:
        kept = await release.store_sends(self._ctx, accepted, now_ms)
        # Released before the results are built (they show "ready").
        return await release.release_now(self._ctx, accepted, kept, now_ms), kept

    async def counts_by_state(self) -> dict[str, int]:
        by_state = await self._ctx.counts_by_state()
        by_state[MessageState.SCHEDULED.value] = await self._ctx.store.count_scheduled()
        return by_state


def pick(ctx: EngineContext, *, still_held: shared_release.StillHeld) -> ReleasePath:
    """The path for the engine's store (``EngineContext.shared``); ``still_held`` is the
    cluster's (``ClusterLink.still_held``)."""
    return SharedPath(ctx, still_held) if ctx.shared else SeparatePath(ctx)
