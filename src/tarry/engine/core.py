"""``Engine``: tarry's core, composed of the store, the local queues, the dispatcher and the
transports. Every edge (HTTP, AMQP ingress, pipeline) calls it; it calls the model for rules.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import IO, Any, cast

from tarry.config import TarryConfig
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import Dispatcher
from tarry.engine import (
    catalog_admin,
    cluster,
    consuming,
    operations,
    queue_admin,
    release,
    sending,
    shared_release,
)
from tarry.engine.context import EngineContext
from tarry.engine.handover import refuse_if_handed_over
from tarry.engine.housekeeping import housekeeping, sweep
from tarry.engine.lifecycle import lock_data_dir, supervise
from tarry.engine.listeners import emit_all, one_by_one
from tarry.engine.overview import ForecastCache, dead_letter_groups
from tarry.engine.redrive import Redriver
from tarry.engine.routes import RouteBook, RouteEntry, RouteHooks
from tarry.engine.schedules import Schedules
from tarry.engine.stores import build_stores
from tarry.engine.types import Delivery, MayAccess, QueueInfo, SendResult
from tarry.errors import (
    DeliveryFailed,
    InvalidArgument,
    NotAuthorized,
    NotFound,
    TarryError,
)
from tarry.model.events import Event, EventBatchListener, EventListener
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.queue_args import Policy
from tarry.model.redrive import parse_redrive
from tarry.model.route_policy import RoutePolicy
from tarry.model.time import Clock, SystemClock
from tarry.model.validate import (
    SendLimits,
    check_batch_size,
    validate_reschedule,
)
from tarry.queues.catalog import (
    Catalog,
)
from tarry.queues.sequence import Sequencer
from tarry.queues.txn import QueueTxn
from tarry.store.base import DelayedStore, QueueDatabase
from tarry.transports.base import Transport
from tarry.transports.build import build_transport, rabbitmq_module

__all__ = ["Engine"]

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        config: TarryConfig,
        *,
        store: DelayedStore,
        queues: QueueDatabase | None = None,
        clock: Clock | None = None,
        transports: Mapping[str, Transport] | None = None,
    ) -> None:
        """``queues`` is the queue database when the store does not share one (see
        ``tarry.store.base``); a store that shares it is its own queue database."""
        self.config = config
        self.store = store
        #: True: release is one queue-database transaction; False: ``tarry.engine.release``.
        self.shared = store.shares_queue_database
        if queues is None:
            if not self.shared:
                raise TypeError("a store that does not share the queue database needs queues=")
            queues = cast(QueueDatabase, store)
        self.qdb: QueueDatabase = queues
        self.clock: Clock = clock or SystemClock()
        self.ids = IdGenerator()
        self.catalog = Catalog()
        self.transports: dict[str, Transport] = dict(transports or {})
        self.breakers = Breakers.from_config(config.dispatch, self.clock)
        self._probing: asyncio.Future[bool] | None = None
        self.limits = SendLimits(max_message_bytes=config.server.max_message_bytes)
        #: Every listener in its form for many events (``add_listener``).
        self._listeners: list[EventBatchListener] = []
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
            notify=self._emit_all,
            policy_for=self.route_policy,
            report_failure=self._report_failure,
        )
        self.schedules = Schedules(
            config=config.schedules,
            clock=self.clock,
            qdb=self.qdb,
            # One process owns an embedded store (its lock file): a restart is the same node.
            node=getattr(store, "node", None) or "local",
            send_many=lambda items: sending.send_many(self, items, None),
            check_many=lambda items, may: sending.check_many(self, items, may),
            list_messages=self.list_messages,
            cancel=self.cancel,
        )
        self.routes = RouteBook(
            configured=config.routes,
            transports=self.transports,
            hooks=RouteHooks(
                qdb=self.qdb,
                catalog=lambda: self.catalog,
                now_ms=self.clock.now_ms,
                build=lambda name, route: build_transport(name, route, clock=self.clock),
                count_waiting=self.store.count_scheduled,
                find=self.list_messages,
                give_up=self._give_up,
            ),
        )

        def due(deliver_at_ms: int, now_ms: int) -> None:
            self.dispatcher.notify_due(deliver_at_ms)
            cluster.announce_due(self, deliver_at_ms, now_ms)

        self.redriver = Redriver(
            qdb=self.qdb,
            store=store,
            catalog=lambda: self.catalog,
            clock=self.clock,
            shared=self.shared,
            open_txn=self._txn,
            committed=self._after,
            emit=self._emit_all,
            is_route=lambda name: name in self.transports,
            due=due,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._forecasts = ForecastCache()
        self._lock_file: IO[str] | None = None
        self.journal: Any = None
        self.ingress: Any = None
        cluster.attach(self)
        #: What the engine's parts get of it (built after ``cluster.attach``, which may
        #: replace the waiters and the sequencer).
        self.ctx = EngineContext(
            config=config,
            store=store,
            qdb=self.qdb,
            shared=self.shared,
            clock=self.clock,
            catalog=self.catalog,
            transports=self.transports,
            waiters=self.waiters,
            txn=self._txn,
            after=self._after,
            emit=self._emit_all,
        )

    @classmethod
    def from_config(cls, config: TarryConfig, *, clock: Clock | None = None) -> Engine:
        store, queues = build_stores(config)
        transports = {
            name: build_transport(name, route, clock=clock) for name, route in config.routes.items()
        }
        return cls(config, store=store, queues=queues, clock=clock, transports=transports)

    # --- lifecycle ----------------------------------------------------------------------------
    def add_listener(
        self, listener: EventListener, *, many: EventBatchListener | None = None
    ) -> None:
        self._listeners.append(many if many is not None else one_by_one(listener))

    async def start(self, *, background: bool = True) -> None:
        """``background=False`` leaves the dispatcher and housekeeping loops to the caller (tests
        drive them step by step with a ManualClock)."""
        data_dir = self.config.server.data_dir
        if self.config.store.engine != "memory":
            self._lock_file = lock_data_dir(data_dir)
        if not self.shared:
            await self.qdb.open()
        await self.store.open()

        def load(conn: sqlite3.Connection) -> int:
            self.catalog.load(conn, now_ms=self.clock.now_ms())
            return int(conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0])

        self._seq.value = await self.qdb.read(load)
        self.routes.apply(self.catalog.routes)
        await self.redriver.open()
        if self.config.journal.enabled:
            from tarry.journal.writer import Journal

            self.journal = Journal(
                data_dir / "journal",
                self.config.journal,
                clock=self.clock,
                node=self.config.journal.node or socket.gethostname(),
            )
            self.add_listener(self.journal.record, many=self.journal.record_many)
            if background:
                self._spawn(self.journal.run)
        await self._declare_configured()
        if self.config.rabbitmq.ingress:
            rabbitmq_module()
            from tarry.transports.amqp_ingress import AmqpIngress

            self.ingress = AmqpIngress(self.config.rabbitmq, send_batch=self.send_batch)
            await self.ingress.start()
        await self.schedules.start()  # before the dispatcher: long-overdue ones are missed
        if background:
            self._spawn(self.dispatcher.run)
            self._spawn(self._housekeeping)
            self._spawn(self.schedules.run)
        log.info(
            "engine started: %d queues, %d topics",
            len(self.catalog.queues),
            len(self.catalog.topics),
        )

    async def stop(self) -> None:
        if self.ingress is not None:
            await self.ingress.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.dispatcher.drain()
        await self.routes.close()
        for transport in self.transports.values():
            await transport.close()
        if self.journal is not None:
            self.journal.close()
        await self.store.close()
        if not self.shared:
            await self.qdb.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _spawn(self, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._tasks.append(supervise(loop_fn))

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
    def _emit_each(self, event: str, messages: Sequence[Message], time_ms: int) -> None:
        """``_emit_all`` of ``event`` for every message (a batch's thousands of events)."""
        self._emit_all([(event, message, time_ms, None, None) for message in messages])

    def _emit_all(self, events: Sequence[Event]) -> None:
        emit_all(self._listeners, events)

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
        self._emit_all(txn.events)  # a released batch has an event per message
        self.waiters.wake(txn.filled)

    # --- sending ------------------------------------------------------------------------------
    async def send(
        self, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> SendResult:
        result = (await sending.send_many(self, [data], may_send))[0]
        if isinstance(result, TarryError):
            raise result
        return result

    async def send_batch(
        self, items: Sequence[Mapping[str, Any]], *, may_send: MayAccess | None = None
    ) -> list[SendResult | TarryError]:
        check_batch_size(items, limit=self.config.server.max_batch)
        return await sending.send_many(self, items, may_send)

    # --- one message ----------------------------------------------------------------------------
    async def get_message(self, message_id: str) -> Message:
        message = None if self.shared else await release.get_released(self, message_id)
        if message is None:
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
        refuse_if_handed_over(await self._check_owner(message_id, may_send), self.transports)
        if not self.shared:
            await release.refuse_if_released(self, message_id)
        now = self.clock.now_ms()
        message = await self.store.cancel(message_id, now_ms=now)
        self._emit_all([("cancelled", message, now, None, None)])
        return message

    async def reschedule(
        self, message_id: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> Message:
        current = await self._check_owner(message_id, may_send)
        refuse_if_handed_over(current, self.transports)
        now = self.clock.now_ms()
        deliver_at = validate_reschedule(data, now_ms=now, expires_at_ms=current.expires_at_ms)
        if not self.shared:
            await release.refuse_if_released(self, message_id)
        message = await self.store.reschedule(message_id, deliver_at_ms=deliver_at, now_ms=now)
        self._emit_all([("rescheduled", message, now, None, None)])
        self.dispatcher.notify_due(deliver_at)
        return message

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        if not 1 <= query.limit <= 1000:
            raise InvalidArgument(f"limit ({query.limit}) must be between 1 and 1000")
        if not self.shared:
            return await release.list_merged(self, query)
        return await self.store.list(query)

    async def redrive(
        self, queue: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> dict[str, Any]:
        """Move dead letters of ``queue`` back where they came from (``tarry.engine.redrive``)."""
        return await self.redriver.redrive(queue, parse_redrive(data), may_send=may_send)

    # --- dispatch hooks -------------------------------------------------------------------------
    async def _release_local(
        self, batch: Sequence[Message]
    ) -> list[tuple[Message, DeliveryFailed]]:
        if not self.shared:
            return await release.release(self, batch)
        return await shared_release.release(self.ctx, batch)

    def route_policy(self, name: str) -> RoutePolicy | None:
        """The delivery policy of the route ``name`` (None: not a route)."""
        # From the route book: a route put at run time has its policy too.
        route = self.routes.find(name)
        return route.policy if route is not None else None

    async def _report_failure(self, request: dict[str, Any]) -> None:
        """A route's failure report, sent as tarry itself (the route's settings were authorised
        to name its destination when they were given)."""
        await self.send(request, may_send=None)

    async def _give_up(self, message: Message, error: DeliveryFailed) -> None:
        if not self.shared:
            return await release.give_up(self, message, error)
        await shared_release.give_up(self.ctx, message, error)

    # --- queues ---------------------------------------------------------------------------------
    async def declare_queue(self, name: str, args: Mapping[str, Any]) -> tuple[QueueInfo, bool]:
        return await queue_admin.declare_queue(self.ctx, name, args)

    async def queue_info(self, name: str) -> QueueInfo:
        return await queue_admin.queue_info(self.ctx, name)

    async def list_queues(self) -> list[QueueInfo]:
        return await queue_admin.list_queues(self.ctx)

    async def delete_queue(self, name: str) -> None:
        await queue_admin.delete_queue(self.ctx, name)

    async def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_ms: int | None = None,
    ) -> list[Delivery]:
        return await consuming.receive(
            self, queue, max_messages=max_messages, wait_ms=wait_ms, visibility_ms=visibility_ms
        )

    async def ack(self, queue: str, receipts: Sequence[str]) -> dict[str, Any]:
        return await consuming.settle(self, queue, receipts, ack=True, requeue=False)

    async def nack(self, queue: str, receipts: Sequence[str], *, requeue: bool) -> dict[str, Any]:
        return await consuming.settle(self, queue, receipts, ack=False, requeue=requeue)

    # --- topics and policies --------------------------------------------------------------------
    async def declare_topic(self, name: str) -> tuple[dict[str, Any], bool]:
        return await catalog_admin.declare_topic(self.ctx, name)

    async def topic_info(self, name: str) -> dict[str, Any]:
        return await catalog_admin.topic_info(self.ctx, name)

    async def list_topics(self) -> list[dict[str, Any]]:
        return [await self.topic_info(name) for name in sorted(self.catalog.topics)]

    async def subscribe(self, topic: str, queue: str) -> dict[str, Any]:
        return await catalog_admin.subscribe(self.ctx, topic, queue)

    async def unsubscribe(self, topic: str, queue: str) -> None:
        await catalog_admin.unsubscribe(self.ctx, topic, queue)

    async def put_policy(self, name: str, data: Mapping[str, Any]) -> Policy:
        return await catalog_admin.put_policy(self.ctx, name, data)

    async def delete_policy(self, name: str) -> None:
        await catalog_admin.delete_policy(self.ctx, name)

    async def list_policies(self) -> list[Policy]:
        return await catalog_admin.list_policies(self.ctx)

    # --- schedules (tarry.engine.schedules) -----------------------------------------------------
    async def put_schedule(
        self, name: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> tuple[dict[str, Any], bool]:
        return await self.schedules.put(name, data, may_send=may_send)

    async def get_schedule(self, name: str) -> dict[str, Any]:
        return await self.schedules.get(name)

    async def list_schedules(self) -> list[dict[str, Any]]:
        return await self.schedules.list()

    async def delete_schedule(self, name: str) -> dict[str, Any]:
        return await self.schedules.delete(name)

    # --- routes (tarry.engine.routes) -----------------------------------------------------------
    async def put_route(self, name: str, data: Mapping[str, Any]) -> tuple[RouteEntry, bool]:
        return await self.routes.put(name, data)

    def get_route(self, name: str) -> RouteEntry:
        return self.routes.get(name)

    def list_routes(self) -> list[RouteEntry]:
        return self.routes.entries()

    async def delete_route(self, name: str, *, force: bool = False) -> int:
        return await self.routes.delete(name, force=force)

    # --- housekeeping ---------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        await housekeeping(self.ctx, breakers=self.breakers, probe=self.probe_store)

    async def sweep(self) -> None:
        await sweep(self.ctx)

    async def probe_store(self) -> bool:
        """The store breaker's half-open trial while it is open: one small durable write
        (``DelayedStore.probe``) tells whether the fault cleared. Callers arriving while one
        is under way share it (a burst of refused sends makes one probe, not one each)."""
        if self._probing is None:
            self._probing = asyncio.ensure_future(self._probe_once())
        return await asyncio.shield(self._probing)

    async def _probe_once(self) -> bool:
        try:
            await self.store.probe()
            return True
        except TarryError:
            return False
        finally:
            self._probing = None

    # --- operations -----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return operations.health(
            self.ctx,
            breakers=self.breakers,
            release_lag_ms=self.dispatcher.lag.lag_ms(),
            ingress=self.ingress,
        )

    async def forecast(self) -> dict[str, Any]:
        return await self._forecasts.get(self.store, self.clock.now_ms())

    async def dead_letters(self) -> list[dict[str, Any]]:
        """Each dead-letter queue (the error queue, and every queue some queue's arguments in
        force dead-letter into) with its messages grouped by ``deaths[0]``."""
        targets = {self.config.dispatch.error_queue}
        for entry in self.catalog.queues.values():
            if entry.effective.dead_letter_to is not None:
                targets.add(entry.effective.dead_letter_to)
        return [
            {"queue": name, "groups": await dead_letter_groups(self.qdb, name)}
            for name in sorted(targets)
            if name in self.catalog.queues
        ]

    async def stats(self) -> dict[str, Any]:
        return await operations.stats(
            self.ctx, dispatch=self.dispatcher.stats, journal=self.journal, health=self.health()
        )
