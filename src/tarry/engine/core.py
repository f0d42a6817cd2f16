"""``Engine``: tarry's core, composed of the store, the local queues, the dispatcher and the
transports. Every edge (HTTP, AMQP ingress, pipeline) calls it; it calls the model for rules.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import sqlite3
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any

from tarry.config import TarryConfig
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import Dispatcher
from tarry.engine.types import (
    Delivery,
    EventListener,
    MayAccess,
    MessageQuery,
    QueueInfo,
    SendResult,
)
from tarry.errors import (
    DeliveryFailed,
    InvalidArgument,
    NotAuthorized,
    NotFound,
    PreconditionFailed,
    TarryError,
    Unavailable,
)
from tarry.model.ids import IdGenerator
from tarry.model.message import DeathReason, Message, SendPlan
from tarry.model.queue_args import Overflow, Policy, parse_policy, parse_queue_args
from tarry.model.state import MessageState
from tarry.model.time import Clock, SystemClock
from tarry.model.validate import (
    DestinationView,
    SendLimits,
    TargetView,
    check_batch_size,
    check_name,
    parse_send,
    validate_reschedule,
    validate_send,
)
from tarry.queues.catalog import (
    Catalog,
    QueueEntry,
    delete_queue_rows,
    save_policy,
    save_queue,
    save_subscription,
    save_topic,
)
from tarry.queues.txn import QueueTxn, Sequencer
from tarry.store.sqlite.store import SQLiteStore, insert_messages
from tarry.transports.base import Transport

__all__ = ["Engine"]

log = logging.getLogger(__name__)

DEFAULT_VISIBILITY_MS = 30_000
MAX_VISIBILITY_MS = 12 * 3_600_000


class Engine:
    def __init__(
        self,
        config: TarryConfig,
        *,
        store: SQLiteStore,
        clock: Clock | None = None,
        transports: Mapping[str, Transport] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.ids = IdGenerator()
        self.catalog = Catalog()
        self.transports: dict[str, Transport] = dict(transports or {})
        self.breakers = Breakers.from_config(config.dispatch, self.clock)
        self.limits = SendLimits(max_message_bytes=config.server.max_message_bytes)
        self._listeners: list[EventListener] = []
        self._seq = Sequencer()
        from tarry.engine.waiters import Waiters

        self.waiters = Waiters()
        self.dispatcher = Dispatcher(
            store=store,
            config=config.dispatch,
            clock=self.clock,
            breakers=self.breakers,
            is_local=lambda name: name not in self.transports,
            transport_for=self.transports.get,
            release_local=self._release_local,
            give_up=self._give_up,
            notify=self._emit,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._lock_file: IO[str] | None = None
        self.journal: Any = None

    @classmethod
    def from_config(cls, config: TarryConfig, *, clock: Clock | None = None) -> Engine:
        path = None if config.store.engine == "memory" else config.db_path
        store = SQLiteStore(
            path, synchronous=config.store.synchronous, max_pages=config.store.max_pages
        )
        transports: dict[str, Transport] = {}
        for name, route in config.routes.items():
            if route.transport == "http":
                from tarry.transports.http import HttpTransport

                transports[name] = HttpTransport(route)
            else:
                raise InvalidArgument(
                    f"route {name!r}: transport {route.transport!r} is not available in this build"
                )
        return cls(config, store=store, clock=clock, transports=transports)

    # --- lifecycle ----------------------------------------------------------------------------
    def add_listener(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    async def start(self, *, background: bool = True) -> None:
        """``background=False`` leaves the dispatcher and housekeeping loops to the caller (tests
        drive them step by step with a ManualClock)."""
        data_dir = self.config.server.data_dir
        if self.config.store.engine != "memory":
            self._lock(data_dir)
        await self.store.open()

        def load(conn: sqlite3.Connection) -> int:
            self.catalog.load(conn, now_ms=self.clock.now_ms())
            return int(conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0])

        self._seq.value = await self.store.read(load)
        if self.config.journal.enabled:
            from tarry.journal.writer import Journal

            self.journal = Journal(
                data_dir / "journal",
                self.config.journal,
                clock=self.clock,
                node=self.config.journal.node or socket.gethostname(),
            )
            self.add_listener(self.journal.record)
            if background:
                self._spawn(self.journal.run())
        await self._declare_configured()
        if background:
            self._spawn(self.dispatcher.run())
            self._spawn(self._housekeeping())
        log.info(
            "engine started: %d queues, %d topics",
            len(self.catalog.queues),
            len(self.catalog.topics),
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.dispatcher.drain()
        for transport in self.transports.values():
            await transport.close()
        if self.journal is not None:
            self.journal.close()
        await self.store.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _lock(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(data_dir / "tarry.lock", "a+")  # noqa: SIM115 - held for the process life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise Unavailable(
                f"another tarry process is using {data_dir}; stop it or choose another --data"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock_file = handle

    def _spawn(self, coro: Any) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    async def _declare_configured(self) -> None:
        error_queue = self.config.dispatch.error_queue
        if error_queue not in self.catalog.queues:
            await self.declare_queue(error_queue, {})
        for name, args in self.config.queues.items():
            await self.declare_queue(name, args)
        for topic, queues in self.config.topics.items():
            await self.declare_topic(topic)
            for queue in queues:
                if queue not in self.catalog.queues:
                    await self.declare_queue(queue, {})
                await self.subscribe(topic, queue)

    # --- events -------------------------------------------------------------------------------
    def _emit(
        self, event: str, message: Message, time_ms: int, queue: str | None, reason: str | None
    ) -> None:
        for listener in self._listeners:
            try:
                listener(event, message, time_ms, queue, reason)
            except Exception:  # a listener must never break a state change already committed
                log.exception("event listener failed")

    def _txn(self, conn: sqlite3.Connection, now_ms: int) -> QueueTxn:
        return QueueTxn(
            conn,
            now_ms=now_ms,
            catalog=self.catalog,
            ids=self.ids,
            seq=self._seq,
            waiting=self.waiters.count,
            error_queue=self.config.dispatch.error_queue,
        )

    def _after(self, txn: QueueTxn) -> None:
        for event in txn.events:
            self._emit(*event)
        self.waiters.wake(txn.filled)

    # --- sending ------------------------------------------------------------------------------
    async def send(
        self, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> SendResult:
        result = (await self._send_many([data], may_send))[0]
        if isinstance(result, TarryError):
            raise result
        return result

    async def send_batch(
        self, items: Sequence[Mapping[str, Any]], *, may_send: MayAccess | None = None
    ) -> list[SendResult | TarryError]:
        check_batch_size(items, limit=self.config.server.max_batch)
        return await self._send_many(items, may_send)

    async def _send_many(
        self, items: Sequence[Mapping[str, Any]], may_send: MayAccess | None
    ) -> list[SendResult | TarryError]:
        now = self.clock.now_ms()
        results: list[SendResult | TarryError | None] = [None] * len(items)
        accepted: list[tuple[int, SendPlan, list[Message]]] = []
        views: dict[str, DestinationView] = {}
        for index, data in enumerate(items):
            try:
                request = parse_send(data)
                allowed = may_send(request.destination) if may_send else True
                if (
                    allowed
                    and self.catalog.kind(request.destination) is None
                    and (
                        request.destination not in self.transports
                        and self.config.server.auto_declare
                    )
                ):
                    await self.declare_queue(request.destination, {})
                view = views.get(request.destination)
                if view is None:
                    view = views[request.destination] = await self._view(request.destination)
                plan = validate_send(
                    request, now_ms=now, destination=view, may_send=allowed, limits=self.limits
                )
                accepted.append((index, plan, self._messages_for(plan, view)))
            except TarryError as exc:
                results[index] = exc
        if accepted:
            if self.breakers.store.is_open and not await self._store_probe():
                error = Unavailable(
                    "the store cannot take writes now; nothing was stored, retry later"
                )
                for index, _, _ in accepted:
                    results[index] = error
                return [r for r in results if r is not None]
            try:
                stored = await self.store.write(
                    lambda conn: self._store_work(conn, accepted, now), durable=True
                )
            except TarryError as exc:
                self.breakers.store.failure(exc)
                for index, _, _ in accepted:
                    results[index] = exc
                return [r for r in results if r is not None]
            self.breakers.store.success()
            txn, outcomes = stored
            earliest = None
            for (index, plan, messages), (result, created) in zip(accepted, outcomes, strict=True):
                results[index] = result
                if created:
                    for message in messages:
                        self._emit("scheduled", message, now, None, None)
                    if plan.deliver_at_ms > now or any(
                        m.destination in self.transports for m in messages
                    ):
                        earliest = (
                            plan.deliver_at_ms
                            if earliest is None
                            else min(earliest, plan.deliver_at_ms)
                        )
            self._after(txn)
            if earliest is not None:
                self.dispatcher.notify_due(earliest)
        return [r for r in results if r is not None]

    async def _store_probe(self) -> bool:
        """While the store breaker is open, one cheap write tells whether the fault cleared."""
        try:
            await self.store.write(lambda conn: conn.execute("SELECT 1").fetchone())
            return True
        except TarryError:
            return False

    def _store_work(
        self,
        conn: sqlite3.Connection,
        accepted: list[tuple[int, SendPlan, list[Message]]],
        now: int,
    ) -> tuple[QueueTxn, list[tuple[SendResult, bool]]]:
        txn = self._txn(conn, now)
        outcomes: list[tuple[SendResult, bool]] = []
        # One insert for the whole batch; then each plan takes back its own rows.
        everything = insert_messages(conn, [m for _, _, messages in accepted for m in messages])
        start = 0
        for _, plan, messages in accepted:
            stored = everything[start : start + len(messages)]
            start += len(messages)
            created = all(o.created for o in stored) if stored else True
            if not plan.delayed:
                for outcome in stored:
                    if outcome.created and outcome.message.destination not in self.transports:
                        try:
                            txn.enqueue(outcome.message, outcome.message.destination)
                        except DeliveryFailed:
                            pass  # stays scheduled and due now: the dispatcher handles the failure
            first = stored[0].message if stored else None
            topic = (
                plan.request.destination
                if self.catalog.kind(plan.request.destination) == "topic"
                else None
            )
            if first is None:
                result = SendResult(
                    id=self.ids.new(now),
                    state="no_subscribers",
                    deliver_at_ms=plan.deliver_at_ms,
                    expires_at_ms=plan.expires_at_ms,
                    destination=plan.request.destination,
                )
            else:
                result = SendResult(
                    id=first.id,
                    state=first.state.value,
                    deliver_at_ms=first.deliver_at_ms,
                    expires_at_ms=first.expires_at_ms,
                    created=created,
                    destination=plan.request.destination,
                    copies=tuple((o.message.id, o.message.destination) for o in stored)
                    if topic
                    else (),
                )
            outcomes.append((result, created))
        return txn, outcomes

    def _messages_for(self, plan: SendPlan, view: DestinationView) -> list[Message]:
        """One message, or one staged copy per subscriber of a topic (fan-out at send time)."""
        request = plan.request
        targets: list[tuple[str, str | None]]
        if view.kind == "topic":
            targets = [(t.name, request.destination) for t in view.targets]
        else:
            targets = [(request.destination, None)]
        state = MessageState.SCHEDULED
        return [
            Message(
                id=self.ids.new(plan.sent_at_ms),
                destination=name,
                topic=topic,
                body=request.body,
                headers=dict(request.headers),
                sent_at_ms=plan.sent_at_ms,
                deliver_at_ms=plan.deliver_at_ms,
                expires_at_ms=plan.expires_at_ms,
                state=state,
                message_id=request.message_id,
                correlation_id=request.correlation_id,
                reply_to=request.reply_to,
                report=request.report,
                on_undeliverable=request.on_undeliverable,
                persistent=request.persistent,
                updated_at_ms=plan.sent_at_ms,
            )
            for name, topic in targets
        ]

    async def _view(self, name: str) -> DestinationView:
        if name in self.transports:
            return DestinationView(name, "route")
        kind = self.catalog.kind(name)
        if kind == "queue":
            return DestinationView(name, kind, (await self._target(name),))
        if kind == "topic":
            queues = sorted(self.catalog.topics[name])
            return DestinationView(name, kind, tuple([await self._target(q) for q in queues]))
        return DestinationView(name, None)

    async def _target(self, queue: str) -> TargetView:
        args = self.catalog.queues[queue].effective
        full = False
        if args.max_length is not None and args.overflow is Overflow.REJECT_PUBLISH:
            now = self.clock.now_ms()
            ready = await self.store.read(lambda conn: self._txn(conn, now).ready_count(queue))
            full = ready >= args.max_length
        return TargetView(
            queue, put_enabled=args.put_enabled, max_message_bytes=args.max_message_bytes, full=full
        )

    # --- one message ----------------------------------------------------------------------------
    async def get_message(self, message_id: str) -> Message:
        message = await self.store.get(message_id)
        if message is None:
            raise NotFound(f"no message with id {message_id}")
        return message

    async def _check_owner(self, message_id: str, may_send: MayAccess | None) -> Message:
        message = await self.get_message(message_id)
        if may_send is not None and not may_send(message.topic or message.destination):
            raise NotAuthorized(
                f"this token may not change messages for {message.topic or message.destination!r}"
            )
        return message

    async def cancel(self, message_id: str, *, may_send: MayAccess | None = None) -> Message:
        await self._check_owner(message_id, may_send)
        now = self.clock.now_ms()
        message = await self.store.cancel(message_id, now_ms=now)
        self._emit("cancelled", message, now, None, None)
        return message

    async def reschedule(
        self, message_id: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> Message:
        current = await self._check_owner(message_id, may_send)
        now = self.clock.now_ms()
        deliver_at = validate_reschedule(data, now_ms=now, expires_at_ms=current.expires_at_ms)
        message = await self.store.reschedule(message_id, deliver_at_ms=deliver_at, now_ms=now)
        self._emit("rescheduled", message, now, None, None)
        self.dispatcher.notify_due(deliver_at)
        return message

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        if not 1 <= query.limit <= 1000:
            raise InvalidArgument(f"limit ({query.limit}) must be between 1 and 1000")
        return await self.store.list(query)

    # --- dispatch hooks -------------------------------------------------------------------------
    async def _release_local(
        self, batch: Sequence[Message]
    ) -> list[tuple[Message, DeliveryFailed]]:
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[QueueTxn, list[tuple[Message, DeliveryFailed]]]:
            txn = self._txn(conn, now)
            refused = []
            for message in batch:
                try:
                    txn.enqueue(message, message.destination)
                except DeliveryFailed as exc:
                    refused.append((message, exc))
            return txn, refused

        try:
            txn, refused = await self.store.write(work)
        finally:
            self.store.release_claims([m.id for m in batch])
        self._after(txn)
        return refused

    async def _give_up(self, message: Message, error: DeliveryFailed) -> None:
        now = self.clock.now_ms()
        text = f"{error.reason}: {error.message}"

        def work(conn: sqlite3.Connection) -> QueueTxn:
            txn = self._txn(conn, now)
            row = conn.execute("SELECT state FROM messages WHERE id = ?", (message.id,)).fetchone()
            if row is None or row[0] != MessageState.SCHEDULED.value:
                return txn  # cancelled or finished meanwhile
            conn.execute(
                "UPDATE messages SET failures = ? WHERE id = ?", (message.failures, message.id)
            )
            txn.dead_letter(
                message, from_queue=None, reason=DeathReason.DELIVERY_FAILED, error=text
            )
            return txn

        try:
            txn = await self.store.write(work)
        finally:
            self.store.release_claims([message.id])
        self._after(txn)

    # --- queues ---------------------------------------------------------------------------------
    async def declare_queue(self, name: str, args: Mapping[str, Any]) -> tuple[QueueInfo, bool]:
        check_name(name, field="queue name")
        parsed = parse_queue_args(args)
        now = self.clock.now_ms()
        if name in self.catalog.topics or name in self.transports:
            raise PreconditionFailed(f"{name!r} is already a topic or a route; choose another name")
        entry = self.catalog.queues.get(name)
        if entry is not None:
            if entry.args != parsed:
                differing = [
                    f"{k} ({v!r} in force, {parsed.to_dict()[k]!r} requested)"
                    for k, v in entry.args.to_dict().items()
                    if parsed.to_dict()[k] != v
                ]
                raise PreconditionFailed(
                    f"queue {name!r} exists with other arguments: {', '.join(differing)}; "
                    "declare it with the same arguments or delete it first"
                )
            entry.last_used_ms = now  # a redeclare renews an unused queue's lease
            existing = entry
            await self.store.write(lambda conn: save_queue(conn, existing), durable=True)
            return await self.queue_info(name), False
        entry = QueueEntry(name, parsed, now, now)
        await self.store.write(lambda conn: save_queue(conn, entry), durable=True)
        self.catalog.queues[name] = entry
        self.catalog.recompute()
        return await self.queue_info(name), True

    async def queue_info(self, name: str) -> QueueInfo:
        entry = self.catalog.queues.get(name)
        if entry is None:
            raise NotFound(f"no queue named {name!r}")
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[int, int, int]:
            ready, in_flight = conn.execute(
                "SELECT coalesce(sum(visible_at_ms <= ?), 0), coalesce(sum(visible_at_ms > ?), 0) "
                "FROM messages WHERE queue = ? AND state IN ('ready', 'delivered')",
                (now, now, name),
            ).fetchone()
            scheduled = conn.execute(
                "SELECT count(*) FROM messages WHERE destination = ? AND state = 'scheduled'",
                (name,),
            ).fetchone()[0]
            return int(ready), int(in_flight), int(scheduled)

        ready, in_flight, scheduled = await self.store.read(work)
        return QueueInfo(
            name=name,
            args=entry.args,
            effective=entry.effective,
            ready=ready,
            in_flight=in_flight,
            scheduled=scheduled,
            consumers_waiting=self.waiters.count.get(name, 0),
            created_at_ms=entry.created_at_ms,
            last_used_ms=entry.last_used_ms,
        )

    async def list_queues(self) -> list[QueueInfo]:
        return [await self.queue_info(name) for name in sorted(self.catalog.queues)]

    async def delete_queue(self, name: str) -> None:
        if name not in self.catalog.queues:
            raise NotFound(f"no queue named {name!r}")
        if name == self.config.dispatch.error_queue:
            raise PreconditionFailed(f"{name!r} is the error queue; it cannot be deleted")
        await self._drop_queue(name, reason="deleted")

    async def _drop_queue(self, name: str, *, reason: str) -> None:
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> QueueTxn:
            txn = self._txn(conn, now)
            delete_queue_rows(conn, name)
            txn.expire_queue_contents(name)
            return txn

        txn = await self.store.write(work)
        self.catalog.queues.pop(name, None)
        for subscribers in self.catalog.topics.values():
            subscribers.discard(name)
        self._after(txn)
        self.waiters.wake({name})
        log.info("queue %s %s", name, reason)

    async def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_ms: int | None = None,
    ) -> list[Delivery]:
        if not 1 <= max_messages <= 1000:
            raise InvalidArgument(f"max ({max_messages}) must be between 1 and 1000")
        if not 0 <= wait_ms <= 20_000:
            raise InvalidArgument(f"wait_ms ({wait_ms}) must be between 0 and 20000")
        visibility = DEFAULT_VISIBILITY_MS if visibility_ms is None else visibility_ms
        if not 1 <= visibility <= MAX_VISIBILITY_MS:
            raise InvalidArgument(
                f"visibility_ms ({visibility}) must be between 1 and {MAX_VISIBILITY_MS}"
            )
        entry = self.catalog.queues.get(queue)
        if entry is None:
            raise NotFound(f"no queue named {queue!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        if wait_ms:
            self.waiters.count[queue] += 1
        try:
            while True:
                event = self.waiters.event(queue)
                now = self.clock.now_ms()
                entry.last_used_ms = now

                def work(
                    conn: sqlite3.Connection, now: int = now
                ) -> tuple[QueueTxn, list[tuple[Message, str]]]:
                    txn = self._txn(conn, now)
                    return txn, txn.receive(
                        queue, max_messages=max_messages, visibility_ms=visibility
                    )

                # Look before taking: an empty poll costs a read, not a commit.
                if await self.store.read(partial(self._has_ready, queue=queue, now_ms=now)):
                    txn, taken = await self.store.write(work)
                    self._after(txn)
                else:
                    taken = []
                if taken or queue not in self.catalog.queues:
                    return [Delivery(m, r) for m, r in taken]
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                # Re-look at least every second: a visibility timeout ending wakes nobody.
                try:
                    await asyncio.wait_for(event.wait(), min(remaining, 1.0))
                except TimeoutError:
                    pass
        finally:
            if wait_ms:
                self.waiters.count[queue] -= 1

    def _has_ready(self, conn: sqlite3.Connection, *, queue: str, now_ms: int) -> bool:
        return self._txn(conn, now_ms).has_ready(queue)

    async def ack(self, queue: str, receipts: Sequence[str]) -> dict[str, Any]:
        return await self._settle(queue, receipts, ack=True, requeue=False)

    async def nack(self, queue: str, receipts: Sequence[str], *, requeue: bool) -> dict[str, Any]:
        return await self._settle(queue, receipts, ack=False, requeue=requeue)

    async def _settle(
        self, queue: str, receipts: Sequence[str], *, ack: bool, requeue: bool
    ) -> dict[str, Any]:
        if queue not in self.catalog.queues:
            raise NotFound(f"no queue named {queue!r}")
        if not isinstance(receipts, list | tuple) or not all(isinstance(r, str) for r in receipts):
            raise InvalidArgument("receipts must be a list of receipt strings from receive")
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[QueueTxn, tuple[int, list[str]]]:
            txn = self._txn(conn, now)
            return txn, txn.settle(queue, receipts, ack=ack, requeue=requeue)

        txn, (done, unknown) = await self.store.write(work)
        self._after(txn)
        return {("acked" if ack else "nacked"): done, "unknown": unknown}

    # --- topics and policies --------------------------------------------------------------------
    async def declare_topic(self, name: str) -> tuple[dict[str, Any], bool]:
        check_name(name, field="topic name")
        if name in self.catalog.queues or name in self.transports:
            raise PreconditionFailed(f"{name!r} is already a queue or a route; choose another name")
        if name in self.catalog.topics:
            return await self.topic_info(name), False
        now = self.clock.now_ms()
        await self.store.write(lambda conn: save_topic(conn, name, now), durable=True)
        self.catalog.topics[name] = set()
        self.catalog.topic_created_ms[name] = now
        return await self.topic_info(name), True

    async def topic_info(self, name: str) -> dict[str, Any]:
        if name not in self.catalog.topics:
            raise NotFound(f"no topic named {name!r}")
        return {
            "name": name,
            "subscriptions": sorted(self.catalog.topics[name]),
            "created_at": self.catalog.topic_created_ms.get(name),
        }

    async def subscribe(self, topic: str, queue: str) -> dict[str, Any]:
        if topic not in self.catalog.topics:
            raise NotFound(f"no topic named {topic!r}; declare it first")
        if queue not in self.catalog.queues:
            raise NotFound(f"no queue named {queue!r}; declare it first")
        await self.store.write(
            lambda conn: save_subscription(conn, topic, queue, True), durable=True
        )
        self.catalog.topics[topic].add(queue)
        return await self.topic_info(topic)

    async def unsubscribe(self, topic: str, queue: str) -> None:
        if topic not in self.catalog.topics:
            raise NotFound(f"no topic named {topic!r}")
        await self.store.write(
            lambda conn: save_subscription(conn, topic, queue, False), durable=True
        )
        self.catalog.topics[topic].discard(queue)

    async def put_policy(self, name: str, data: Mapping[str, Any]) -> Policy:
        policy = parse_policy(name, data)
        await self._change_policies(name, policy)
        return policy

    async def delete_policy(self, name: str) -> None:
        if name not in self.catalog.policies:
            raise NotFound(f"no policy named {name!r}")
        await self._change_policies(name, None)

    async def _change_policies(self, name: str, policy: Policy | None) -> None:
        before = {q: e.effective.message_ttl_ms for q, e in self.catalog.queues.items()}
        candidate = dict(self.catalog.policies)
        if policy is None:
            candidate.pop(name, None)
        else:
            candidate[name] = policy
        changed: list[tuple[str, int | None]] = []

        def work(conn: sqlite3.Connection) -> None:
            save_policy(conn, policy, name)
            # A TTL change reaches the messages already in the queue (RabbitMQ applies policy
            # changes to the queue); each keeps the earlier of its own expiry and the new TTL.
            for queue, ttl in changed:
                conn.execute(
                    "UPDATE messages SET queue_expires_at_ms = CASE "
                    "WHEN ?1 IS NULL THEN expires_at_ms "
                    "WHEN expires_at_ms IS NULL THEN enqueued_at_ms + ?1 "
                    "ELSE min(expires_at_ms, enqueued_at_ms + ?1) END "
                    "WHERE queue = ?2 AND state IN ('ready', 'delivered')",
                    (ttl, queue),
                )

        old = self.catalog.policies
        self.catalog.policies = candidate
        self.catalog.recompute()
        changed.extend(
            (q, e.effective.message_ttl_ms)
            for q, e in self.catalog.queues.items()
            if e.effective.message_ttl_ms != before.get(q)
        )
        try:
            await self.store.write(work, durable=True)
        except BaseException:
            self.catalog.policies = old
            self.catalog.recompute()
            raise

    async def list_policies(self) -> list[Policy]:
        return [self.catalog.policies[n] for n in sorted(self.catalog.policies)]

    # --- housekeeping ---------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        """Sweep expired messages out of queues, delete unused queues, forget old messages."""
        interval = self.config.dispatch.expiry_sweep_ms / 1000
        purge_every, since_purge = 60.0, 0.0
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
                since_purge += interval
                if since_purge >= purge_every:
                    since_purge = 0.0
                    cutoff = self.clock.now_ms() - self.config.server.retention_ms
                    await self.store.purge_finished(before_ms=cutoff)
            except TarryError as exc:
                self.breakers.store.failure(exc)
                log.warning("housekeeping failed: %s", exc)

    async def sweep(self) -> None:
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> QueueTxn:
            txn = self._txn(conn, now)
            txn.sweep_expired()
            return txn

        if await self.store.read(lambda conn: self._txn(conn, now).has_expired()):
            self._after(await self.store.write(work))
        for name, entry in list(self.catalog.queues.items()):
            expires = entry.effective.expires_ms
            if (
                expires is not None
                and not self.waiters.count.get(name)
                and now - entry.last_used_ms >= expires
                and name != self.config.dispatch.error_queue
            ):
                await self._drop_queue(name, reason=f"expired after {expires} ms unused")

    # --- operations -----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        open_names = self.breakers.open_names()
        return {
            "status": "degraded" if open_names else "ok",
            "open": open_names,
            "breakers": self.breakers.snapshot(),
        }

    async def stats(self) -> dict[str, Any]:
        def work(conn: sqlite3.Connection) -> dict[str, int]:
            return {
                s: n for s, n in conn.execute("SELECT state, count(*) FROM messages GROUP BY state")
            }

        by_state = await self.store.read(work)
        d = self.dispatcher.stats
        return {
            "messages": {s.value: by_state.get(s.value, 0) for s in MessageState},
            "queues": len(self.catalog.queues),
            "topics": len(self.catalog.topics),
            "policies": len(self.catalog.policies),
            "consumers_waiting": sum(self.waiters.count.values()),
            "dispatch": {
                "rounds": d.rounds,
                "released": d.released,
                "delivered": d.delivered,
                "failures": d.failures,
                "gave_up": d.gave_up,
            },
            "store_commits": self.store.db.commits,
            "journal_dropped": getattr(self.journal, "dropped", 0),
            "health": self.health(),
        }
