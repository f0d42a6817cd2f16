"""One message by id (get, cancel, reschedule) and the listing, given the engine's context and
its release path: a released message is the queue database's where the store keeps messages
apart from it (``release_path``), and only a scheduled one can be changed."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import Any

from tarry.engine.context import EngineContext
from tarry.engine.handover import refuse_if_handed_over
from tarry.engine.release_path import ReleasePath
from tarry.engine.types import MayAccess
from tarry.errors import InvalidArgument, NotAuthorized, NotFound
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.validate import validate_reschedule

__all__ = ["Messages"]


class Messages:
    def __init__(
        self, ctx: EngineContext, path: ReleasePath, *, notify_due: Callable[[int], None]
    ) -> None:
        """``notify_due``: the dispatcher's, for a rescheduled message's new due time."""
        self._ctx = ctx
        self._path = path
        self._notify_due = notify_due

    async def get(self, message_id: str) -> Message:
        message = await self._path.released(message_id) or await self._ctx.store.get(message_id)
        if message is None:
            raise NotFound(f"no message with id {message_id}")
        return message

    async def _check_owner(self, message_id: str, may_send: MayAccess | None) -> Message:
        message = await self.get(message_id)
        if may_send is not None and not may_send(message.topic or message.destination):
            raise NotAuthorized(
                f"this token may not change messages for {message.topic or message.destination!r}"
            )
        return message

    async def cancel(self, message_id: str, *, may_send: MayAccess | None = None) -> Message:
        refuse_if_handed_over(await self._check_owner(message_id, may_send), self._ctx.transports)
        await self._path.refuse_if_released(message_id)
        now = self._ctx.clock.now_ms()
        message = await self._ctx.store.cancel(message_id, now_ms=now)
        self._ctx.emit([("cancelled", message, now, None, None)])
        return message

    async def reschedule(
        self, message_id: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> Message:
        current = await self._check_owner(message_id, may_send)
        refuse_if_handed_over(current, self._ctx.transports)
        now = self._ctx.clock.now_ms()
        deliver_at = validate_reschedule(data, now_ms=now, expires_at_ms=current.expires_at_ms)
        await self._path.refuse_if_released(message_id)
        message = await self._ctx.store.reschedule(message_id, deliver_at_ms=deliver_at, now_ms=now)
        self._ctx.emit([("rescheduled", message, now, None, None)])
        self._notify_due(deliver_at)
        return message

    async def list(self, query: MessageQuery) -> tuple[builtins.list[Message], str | None]:
        if not 1 <= query.limit <= 1000:
            raise InvalidArgument(f"limit ({query.limit}) must be between 1 and 1000")
        return await self._path.list_messages(query)
