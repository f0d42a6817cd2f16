"""``Engine``: tarry's core, composed of the store, the local queues, the dispatcher and the
transports. Every edge (HTTP, AMQP ingress, pipeline) calls it; it calls the model for rules."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import IO, Any, cast

from tarry.config import TarryConfig
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import Dispatcher
from tarry.engine import catalog_admin, consuming, operations, queue_admin
from tarry.engine.cluster import ClusterLink
from tarry.engine.context import EngineContext
from tarry.engine.housekeeping import StoreProbe, housekeeping, sweep
from tarry.engine.lifecycle import lock_data_dir, open_journal, start_ingress, supervise
from tarry.engine.listeners import emit_all, one_by_one
from tarry.engine.messages import Messages
from tarry.engine.overview import ForecastCache, dead_letters
from tarry.engine.redrive import Redriver
from tarry.engine.release_path import pick
from tarry.engine.routes import RouteBook, RouteEntry, RouteHooks
from tarry.engine.schedules import Schedules
from tarry.engine.sending import Sender
from tarry.engine.stores import build_stores
from tarry.engine.types import Deliveries, MayAccess, QueueInfo, SendResult
from tarry.errors import TarryError
from tarry.model.events import EventBatchListener, EventListener
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.queue_args import Policy
from tarry.model.redrive import parse_redrive
from tarry.model.time import Clock, SystemClock
from tarry.model.validate import check_batch_size
from tarry.queues.catalog import Catalog
from tarry.queues.sequence import last_seq
from tarry.queues.txn import QueueTxn
from tarry.store.base import DelayedStore, QueueDatabase
from tarry.store.sql import QueueConnection
from tarry.transports.base import Transport
from tarry.transports.build import build_transport, build_transports

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
        """``queues``: the queue database, unless the store is its own (``tarry.store.base``)."""
        self.config = config
        self.store = store
        #: True: release is one queue-database transaction (``release_path``).
        self.shared = store.shares_queue_database
        if queues is None:
            if not self.shared:
                raise TypeError("a store that does not share the queue database needs queues=")
            queues = cast(QueueDatabase, store)
        self.clock: Clock = clock or SystemClock()
        self.ids = IdGenerator()
        self.catalog = Catalog()
        self.transports: dict[str, Transport] = dict(transports or {})
        self.breakers = Breakers.from_config(config.dispatch, self.clock)
        #: Every listener in its form for many events (``add_listener``).
        self._listeners: list[EventBatchListener] = []
        self._emit_all = emit = partial(emit_all, self._listeners)
        # What differs where nodes share the store, chosen once (``tarry.engine.cluster``).
        self._link = link = ClusterLink(store, self.clock)
        self._seq = link.sequencer
        self.waiters = link.waiters
        self.memory = link.memory(queues, config.store, self.catalog, emit)
        self.qdb: QueueDatabase = self.memory or queues  # behind its barrier, if kept
        #: What the engine's parts get of it.
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
            due=self._due,
            policy_for=lambda name: self.routes.policy_for(name),
        )
        self.path = pick(self.ctx, still_held=link.still_held)
        self.routes = RouteBook(
            configured=config.routes,
            transports=self.transports,
            hooks=RouteHooks(
                qdb=self.qdb,
                catalog=lambda: self.catalog,
                now_ms=self.clock.now_ms,
                build=partial(build_transport, clock=self.clock, egress=config.egress_policy),
                count_waiting=self.store.count_scheduled,
                find=self.list_messages,
                give_up=self.path.give_up,
            ),
        )
        self.dispatcher = Dispatcher(
            store=store,
            config=config.dispatch,
            clock=self.clock,
            breakers=self.breakers,
            is_local=lambda name: name not in self.transports,
            transport_for=self.transports.get,
            release_local=self.path.release,
            release_at_once=self.path.release_at_once,
            give_up=self.path.give_up,
            notify=self._emit_all,
            policy_for=self.routes.policy_for,
            report_failure=lambda request: self.sender.report_failure(request),
            release_due=link.release_due(self.ctx),
        )
        self.messages = Messages(self.ctx, self.path, notify_due=self.dispatcher.notify_due)
        self.schedules = Schedules(
            config=config.schedules,
            clock=self.clock,
            qdb=self.ctx.queue_db,  # schedules hold no queue rows: no write-out barrier
            # One process owns an embedded store (its lock file): a restart is the same node.
            node=getattr(store, "node", None) or "local",
            send_many=lambda items: self.sender.send_many(items, None, internal=True),
            check_many=lambda items, may: self.sender.check_many(items, may),
            list_messages=self.list_messages,
            cancel=self.cancel,
        )
        self.redriver = Redriver(self.ctx, is_route=lambda name: name in self.transports)
        self.probe_store = StoreProbe(store)
        self.sender = Sender(
            self.ctx,
            self.path,
            ids=self.ids,
            lag=self.dispatcher.lag,
            breakers=self.breakers,
            probe=self.probe_store,
            find=self.list_messages,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._forecasts = ForecastCache()
        self._lock_file: IO[str] | None = None
        self.journal: Any = None
        self.ingress: Any = None
        link.listen(self.ctx, notify_due=self.dispatcher.notify_due, apply_routes=self.routes.apply)

    @classmethod
    def from_config(cls, config: TarryConfig, *, clock: Clock | None = None) -> Engine:
        store, queues = build_stores(config)
        transports = build_transports(config.routes, clock=clock)
        return cls(config, store=store, queues=queues, clock=clock, transports=transports)

    # --- lifecycle ----------------------------------------------------------------------------
    def add_listener(
        self, listener: EventListener, *, many: EventBatchListener | None = None
    ) -> None:
        self._listeners.append(many if many is not None else one_by_one(listener))

    async def start(self, *, background: bool = True) -> None:
        """``background=False``: the caller drives the dispatcher and housekeeping (tests)."""
        data_dir = self.config.server.data_dir
        if self.config.store.engine != "memory":
            self._lock_file = lock_data_dir(data_dir)
        await self.path.open()
        await self.store.open()

        def load(conn: QueueConnection) -> int:
            self.catalog.load(conn, now_ms=self.clock.now_ms())
            return last_seq(conn)

        self._seq.value = await self.qdb.read(load)
        self.routes.apply(self.catalog.routes)
        await self.redriver.open()
        if self.config.journal.enabled:
            self.journal = open_journal(self.config, self.clock)
            self.add_listener(self.journal.record, many=self.journal.record_many)
            if background:
                self._spawn(self.journal.run)
        await catalog_admin.declare_configured(self.ctx)
        if self.config.rabbitmq.ingress:
            self.ingress = await start_ingress(self.config, self.send_batch)
        await self.schedules.start()  # before the dispatcher: long-overdue ones are missed
        if background:
            self._spawn(self.dispatcher.run)
            self._spawn(
                lambda: housekeeping(self.ctx, breakers=self.breakers, probe=self.probe_store)
            )
            self._spawn(self.schedules.run)
        catalog = self.catalog
        log.info("engine started: %d queues, %d topics", len(catalog.queues), len(catalog.topics))

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
        if self.memory is not None:
            await self.memory.drain()
        await self.store.close()
        await self.path.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _spawn(self, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._tasks.append(supervise(loop_fn))

    # --- the parts' context -----------------------------------------------------------------------
    def _txn(self, conn: QueueConnection, now_ms: int, dlq: str | None = None) -> QueueTxn:
        return QueueTxn(
            conn,
            now_ms=now_ms,
            catalog=self.catalog,
            ids=self.ids,
            seq=self._seq,
            waiting=self.waiters.count,
            error_queue=dlq or self.config.dispatch.error_queue,
        )

    def _after(self, txn: QueueTxn) -> None:
        for events in (txn.events, *txn.runs):  # a batch's run: one event per message
            self._emit_all(events)
        self.waiters.wake(txn.filled)

    def _due(self, deliver_at_ms: int, now_ms: int) -> None:
        self.dispatcher.notify_due(deliver_at_ms)
        self._link.announce_due(deliver_at_ms, now_ms)

    # --- sending ------------------------------------------------------------------------------
    async def send(
        self, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> SendResult:
        return await self.sender.send_one(data, may_send)

    async def send_batch(
        self, items: Sequence[Mapping[str, Any]], *, may_send: MayAccess | None = None
    ) -> Sequence[SendResult | TarryError]:
        check_batch_size(items, limit=self.config.server.max_batch)
        return await self.sender.send_many(items, may_send)

    # --- one message ----------------------------------------------------------------------------
    async def get_message(self, message_id: str) -> Message:
        return await self.messages.get(message_id)

    async def cancel(self, message_id: str, *, may_send: MayAccess | None = None) -> Message:
        return await self.messages.cancel(message_id, may_send=may_send)

    async def reschedule(
        self, message_id: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> Message:
        return await self.messages.reschedule(message_id, data, may_send=may_send)

    async def list_messages(self, query: MessageQuery) -> tuple[list[Message], str | None]:
        return await self.messages.list(query)

    async def redrive(
        self, queue: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> dict[str, Any]:
        """Move dead letters of ``queue`` back where they came from (``tarry.engine.redrive``)."""
        return await self.redriver.redrive(queue, parse_redrive(data), may_send=may_send)

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
        ack: Sequence[str] | None = None,
    ) -> Deliveries:
        return await consuming.receive(
            self.ctx,
            queue,
            max_messages=max_messages,
            wait_ms=wait_ms,
            visibility_ms=visibility_ms,
            ack=ack,
        )

    async def ack(self, queue: str, receipts: Sequence[str]) -> dict[str, Any]:
        return await consuming.settle(self.ctx, queue, receipts, ack=True, requeue=False)

    async def nack(self, queue: str, receipts: Sequence[str], *, requeue: bool) -> dict[str, Any]:
        return await consuming.settle(self.ctx, queue, receipts, ack=False, requeue=requeue)

    # --- topics and policies --------------------------------------------------------------------
    async def declare_topic(self, name: str) -> tuple[dict[str, Any], bool]:
        return await catalog_admin.declare_topic(self.ctx, name)

    async def topic_info(self, name: str) -> dict[str, Any]:
        return await catalog_admin.topic_info(self.ctx, name)

    async def list_topics(self) -> list[dict[str, Any]]:
        return await catalog_admin.list_topics(self.ctx)

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
    async def sweep(self) -> None:
        await sweep(self.ctx)

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
        return await dead_letters(self.ctx)

    async def stats(self) -> dict[str, Any]:
        return await operations.stats(
            self.ctx,
            self.path,
            dispatch=self.dispatcher.stats,
            journal=self.journal,
            health=self.health(),
        )
