"""The engine's outward contract: everything the HTTP server (and later the AMQP ingress and the
Spark pipeline's online sink) may ask of tarry's core. ``tarry.engine.core.Engine`` implements it.

Every method raises ``TarryError`` subclasses (never bare exceptions) for anything a caller did
wrong or that the store cannot do now (``unavailable``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tarry.engine.routes import RouteEntry
from tarry.engine.types import Deliveries, MayAccess, QueueInfo, SendResult
from tarry.errors import TarryError
from tarry.model.events import EventBatchListener, EventListener
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.queue_args import Policy

__all__ = ["EngineAPI"]


class EngineAPI(Protocol):
    async def start(self) -> None:
        """Open the store, recover, declare configured queues/topics, start the dispatcher."""

    async def stop(self) -> None:
        """Stop the dispatcher, flush the journal, close the store."""

    # --- messages -------------------------------------------------------------------------
    async def send(
        self, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> SendResult:
        """Validate (``tarry.model.validate``) and durably store one message; returns once it is
        on disk. A repeated ``message_id`` for the same destination returns the first message's
        result with ``created=False``."""

    async def send_batch(
        self, items: Sequence[Mapping[str, Any]], *, may_send: MayAccess | None = None
    ) -> Sequence[SendResult | TarryError]:
        """Each item accepted or rejected on its own, in order; accepted ones share one commit."""

    async def get_message(self, message_id: str) -> Message:
        """Raises ``not_found``."""

    async def cancel(self, message_id: str, *, may_send: MayAccess | None = None) -> Message:
        """Cancel a scheduled message. Raises ``not_found``, ``not_cancellable``."""

    async def reschedule(
        self, message_id: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> Message:
        """``{"delay_ms"}`` (from now) or ``{"deliver_at"}``; raises ``not_found``,
        ``not_cancellable`` (no longer scheduled), ``expiry_error`` (past its expiry),
        ``invalid_argument``."""

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        """Messages ordered by ``deliver_at``; the second item is the next page's cursor."""

    # --- queues ---------------------------------------------------------------------------
    async def declare_queue(self, name: str, args: Mapping[str, Any]) -> tuple[QueueInfo, bool]:
        """Idempotent for equal arguments (True when created); ``precondition_failed`` otherwise."""

    async def queue_info(self, name: str) -> QueueInfo:
        """Raises ``not_found``."""

    async def list_queues(self) -> list[QueueInfo]: ...

    async def delete_queue(self, name: str) -> None:
        """Deletes the queue and its ready/in-flight messages (not dead-lettered, as RabbitMQ)."""

    async def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_ms: int | None = None,
        ack: Sequence[str] | None = None,
    ) -> Deliveries:
        """Up to ``max_messages`` ready messages, waiting up to ``wait_ms`` for the first one.
        Expired messages are never returned. ``ack``: receipts acked first, in the same
        transaction as the first look (before any wait); the answer's ``settled`` says what
        came of them as ``ack`` answers. Raises ``not_found``, ``invalid_argument``."""

    async def ack(self, queue: str, receipts: Sequence[str]) -> dict[str, Any]:
        """``{"acked": n, "unknown": [receipts not (or no longer) valid]}``."""

    async def nack(self, queue: str, receipts: Sequence[str], *, requeue: bool) -> dict[str, Any]:
        """Requeue (keeping the original expiry) or dead-letter with reason ``rejected``."""

    async def redrive(
        self, queue: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> dict[str, Any]:
        """Move dead letters of ``queue`` back to their original destinations (or ``to``), each
        exactly once: ``{"moved", "skipped", "skipped_reasons", "next_cursor"}``. Raises
        ``not_found`` (no such queue), ``unknown_destination`` (``to``), ``not_authorized``,
        ``invalid_argument``; a message whose destination the token may not send to is
        skipped (``not_authorized`` in ``skipped_reasons``)."""

    # --- topics and policies ----------------------------------------------------------------
    async def declare_topic(self, name: str) -> tuple[dict[str, Any], bool]: ...

    async def topic_info(self, name: str) -> dict[str, Any]: ...

    async def list_topics(self) -> list[dict[str, Any]]:
        """Every topic's ``topic_info``, by name."""

    async def subscribe(self, topic: str, queue: str) -> dict[str, Any]:
        """Raises ``not_found`` when the topic or the queue does not exist."""

    async def unsubscribe(self, topic: str, queue: str) -> None: ...

    async def put_policy(self, name: str, data: Mapping[str, Any]) -> Policy: ...

    async def delete_policy(self, name: str) -> None: ...

    async def list_policies(self) -> list[Policy]: ...

    # --- schedules ----------------------------------------------------------------------------
    async def put_schedule(
        self, name: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Create or replace a recurring schedule (True when created) and store its next
        occurrences; raises ``invalid_argument`` for a bad cron or zone, and what the send rules
        refuse for its message."""

    async def get_schedule(self, name: str) -> dict[str, Any]:
        """The definition, its next occurrences and how far they are stored; ``not_found``."""

    async def list_schedules(self) -> list[dict[str, Any]]: ...

    async def delete_schedule(self, name: str) -> dict[str, Any]:
        """Delete it and cancel its stored occurrences; raises ``not_found``."""

    # --- routes -----------------------------------------------------------------------------
    async def put_route(self, name: str, data: Mapping[str, Any]) -> tuple[RouteEntry, bool]:
        """Create or replace a run-time route (True when created); its transport is in force
        when this returns. Raises ``invalid_argument``, ``precondition_failed`` (a name of
        ``tarry.toml``, a queue or a topic)."""

    def get_route(self, name: str) -> RouteEntry:
        """Raises ``not_found``."""

    def list_routes(self) -> list[RouteEntry]:
        """Every route, from ``tarry.toml`` and put at run time, by name."""

    async def delete_route(self, name: str, *, force: bool = False) -> int:
        """Delete a run-time route; returns the waiting messages dead-lettered (``force``).
        Raises ``not_found``, ``precondition_failed`` (``tarry.toml``), ``in_use``."""

    # --- operations -------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``{"status": "ok"|"degraded", "breakers": {name: state}, "open": [names], ...}``."""

    async def stats(self) -> dict[str, Any]:
        """Counts by state, per queue, dispatcher figures."""

    async def forecast(self) -> dict[str, Any]:
        """Scheduled messages by due window: ``next_hour`` (per minute), ``next_day`` (per
        hour), ``next_30_days`` (per day), each ``{"start", "width_ms", "counts"}``; from the
        store's due index (``DelayedStore.due_counts``), at most a few seconds old."""

    async def dead_letters(self) -> list[dict[str, Any]]:
        """``[{"queue", "groups": [{"reason", "original_destination", "count", "oldest",
        "newest"}]}]``: every dead-letter queue's messages by their first death."""

    def add_listener(
        self, listener: EventListener, *, many: EventBatchListener | None = None
    ) -> None:
        """Register a listener for every state change (see ``EventListener``); ``many``, when
        given, takes a batch's events in one call instead of ``listener`` one by one."""
