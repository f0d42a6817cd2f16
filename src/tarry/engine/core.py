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
from collections.abc import Callable, Coroutine, Mapping, Sequence
from itertools import product
from pathlib import Path
from typing import IO, Any, cast

from tarry.config import TarryConfig
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import Dispatcher
from tarry.engine import cluster, consuming, release, sending
from tarry.engine.handover import refuse_if_handed_over
from tarry.engine.overview import ForecastCache, dead_letter_groups
from tarry.engine.redrive import Redriver
from tarry.engine.stores import build_stores
from tarry.engine.types import (
    Delivery,
    Event,
    EventBatchListener,
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
from tarry.model.message import DeathReason, Message
from tarry.model.queue_args import Policy, parse_policy, parse_queue_args
from tarry.model.redrive import parse_redrive
from tarry.model.state import MessageState
from tarry.model.time import Clock, SystemClock
from tarry.model.validate import (
    SendLimits,
    check_batch_size,
    check_name,
    validate_reschedule,
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
from tarry.queues.txn import QUEUED_STATES, QueueTxn, Sequencer
from tarry.store.base import DelayedStore, QueueDatabase
from tarry.store.sql import row_lock
from tarry.transports.base import Transport

__all__ = ["Engine"]

log = logging.getLogger(__name__)


def _rabbitmq() -> Any:
    """The RabbitMQ transports, or a clear error when the optional dependency is missing."""
    try:
        from tarry.transports import rabbitmq_topology
    except ImportError as exc:
        raise InvalidArgument(
            f"RabbitMQ is configured but its client library is missing ({exc}); "
            "install it with pip install 'tarry[rabbitmq]'"
        ) from None
    return rabbitmq_topology


def _one_by_one(listener: EventListener) -> EventBatchListener:
    """A listener without a form for many events, given them one at a time (one that fails on
    an event still gets the others)."""

    def many(events: Sequence[Event]) -> None:
        for event in events:
            try:
                listener(*event)
            except Exception:
                log.exception("event listener failed")

    return many


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

    @classmethod
    def from_config(cls, config: TarryConfig, *, clock: Clock | None = None) -> Engine:
        store, queues = build_stores(config)
        transports: dict[str, Transport] = {}
        for name, route in config.routes.items():
            if route.transport == "http":
                from tarry.transports.http import HttpTransport

                transports[name] = HttpTransport(route)
            elif route.transport == "rabbitmq":
                transports[name] = _rabbitmq().rabbitmq_transport(name, route, clock=clock)
            else:
                raise InvalidArgument(
                    f"route {name!r}: transport {route.transport!r} is not available in this build"
                )
        return cls(config, store=store, queues=queues, clock=clock, transports=transports)

    # --- lifecycle ----------------------------------------------------------------------------
    def add_listener(
        self, listener: EventListener, *, many: EventBatchListener | None = None
    ) -> None:
        self._listeners.append(many if many is not None else _one_by_one(listener))

    async def start(self, *, background: bool = True) -> None:
        """``background=False`` leaves the dispatcher and housekeeping loops to the caller (tests
        drive them step by step with a ManualClock)."""
        data_dir = self.config.server.data_dir
        if self.config.store.engine != "memory":
            self._lock(data_dir)
        if not self.shared:
            await self.qdb.open()
        await self.store.open()

        def load(conn: sqlite3.Connection) -> int:
            self.catalog.load(conn, now_ms=self.clock.now_ms())
            return int(conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0])

        self._seq.value = await self.qdb.read(load)
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
            _rabbitmq()
            from tarry.transports.amqp_ingress import AmqpIngress

            self.ingress = AmqpIngress(self.config.rabbitmq, send_batch=self.send_batch)
            await self.ingress.start()
        if background:
            self._spawn(self.dispatcher.run)
            self._spawn(self._housekeeping)
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

    def _spawn(self, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a background loop for the engine's life. A loop must never end by itself; if one
        does (a bug, or a stray cancellation from a library), it is logged and started again, so
        a node never silently stops dispatching while it still answers HTTP."""

        async def supervised() -> None:
            while True:
                try:
                    await loop_fn()
                    log.error("background loop %s returned; starting it again", loop_fn.__name__)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is None or task.cancelling():  # stop() cancelled it
                        raise
                    # Nobody cancelled this task: a library raised CancelledError at us.
                    log.error(
                        "background loop %s got a stray cancellation; starting it again",
                        loop_fn.__name__,
                        exc_info=True,
                    )
                except Exception:
                    log.exception("background loop %s failed; starting it again", loop_fn.__name__)
                await asyncio.sleep(1.0)

        self._tasks.append(
            asyncio.get_running_loop().create_task(supervised(), name=f"tarry-{loop_fn.__name__}")
        )

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
        """Tell every listener about ``events`` (state changes already made), each listener
        taking them all in one call, in order; a listener must never break a change."""
        for many in self._listeners:
            try:
                many(events)
            except Exception:
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

        def work(conn: sqlite3.Connection) -> tuple[QueueTxn, list[tuple[Message, DeliveryFailed]]]:
            txn = self._txn(conn, self.clock.now_ms())  # when it runs (see ``release._release``)
            refused = []
            # Claim check, enqueue and leaving the store commit together (exactly-once).
            for message in cluster.still_held(self, conn, batch):
                try:
                    txn.enqueue(message, message.destination)
                except DeliveryFailed as exc:
                    refused.append((message, exc))
            return txn, refused

        try:
            txn, refused = await self.qdb.write(work)
        finally:
            self.store.release_claims([m.id for m in batch])
        self._after(txn)
        return refused

    async def _give_up(self, message: Message, error: DeliveryFailed) -> None:
        if not self.shared:
            return await release.give_up(self, message, error)
        now = self.clock.now_ms()
        text = f"{error.reason}: {error.message}"

        def work(conn: sqlite3.Connection) -> QueueTxn:
            txn = self._txn(conn, now)
            row = conn.execute(
                f"SELECT state FROM messages WHERE id = ?{row_lock(conn)}", (message.id,)
            ).fetchone()
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
            txn = await self.qdb.write(work)
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
            await self.qdb.write(lambda conn: save_queue(conn, existing), durable=True)
            return await self.queue_info(name), False
        entry = QueueEntry(name, parsed, now, now)
        await self.qdb.write(lambda conn: save_queue(conn, entry), durable=True)
        self.catalog.queues[name] = entry
        self.catalog.recompute()
        return await self.queue_info(name), True

    async def queue_info(self, name: str) -> QueueInfo:
        entry = self.catalog.queues.get(name)
        if entry is None:
            raise NotFound(f"no queue named {name!r}")
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> tuple[int, int]:
            ready = in_flight = 0
            for state in QUEUED_STATES:
                visible, hidden = conn.execute(
                    "SELECT coalesce(sum(CASE WHEN visible_at_ms <= ? THEN 1 ELSE 0 END), 0), "
                    "coalesce(sum(CASE WHEN visible_at_ms > ? THEN 1 ELSE 0 END), 0) "
                    f"FROM messages WHERE queue = ? AND state = '{state}'",
                    (now, now, name),
                ).fetchone()
                ready, in_flight = ready + int(visible), in_flight + int(hidden)
            return ready, in_flight

        ready, in_flight = await self.qdb.read(work)
        scheduled = await self.store.count_scheduled(name)
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
        """Every queue, by name; one that expires or is deleted while the list is read (each
        ``queue_info`` awaits the queue database) is left out, not a 404 for the whole list."""
        infos = []
        for name in sorted(self.catalog.queues):
            try:
                infos.append(await self.queue_info(name))
            except NotFound:
                continue
        return infos

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

        txn = await self.qdb.write(work)
        self.catalog.queues.pop(name, None)
        for subscribers in self.catalog.topics.values():
            subscribers.discard(name)
        self._after(txn)
        self.waiters.wake({name})
        log.info("queue %s %s", name, reason, extra={"destination": name})

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
        check_name(name, field="topic name")
        if name in self.catalog.queues or name in self.transports:
            raise PreconditionFailed(f"{name!r} is already a queue or a route; choose another name")
        if name in self.catalog.topics:
            return await self.topic_info(name), False
        now = self.clock.now_ms()
        await self.qdb.write(lambda conn: save_topic(conn, name, now), durable=True)
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

    async def list_topics(self) -> list[dict[str, Any]]:
        return [await self.topic_info(name) for name in sorted(self.catalog.topics)]

    async def subscribe(self, topic: str, queue: str) -> dict[str, Any]:
        if topic not in self.catalog.topics:
            raise NotFound(f"no topic named {topic!r}; declare it first")
        if queue not in self.catalog.queues:
            raise NotFound(f"no queue named {queue!r}; declare it first")
        await self.qdb.write(lambda conn: save_subscription(conn, topic, queue, True), durable=True)
        self.catalog.topics[topic].add(queue)
        return await self.topic_info(topic)

    async def unsubscribe(self, topic: str, queue: str) -> None:
        check_name(queue, field="queue name")
        if topic not in self.catalog.topics:
            raise NotFound(f"no topic named {topic!r}")
        await self.qdb.write(
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
            for (queue, ttl), state in product(changed, QUEUED_STATES):
                conn.execute(
                    # Portable SQL (SQLite and PostgreSQL): CASE, not min(a, b) or least().
                    "UPDATE messages SET queue_expires_at_ms = CASE "
                    "WHEN CAST(?1 AS BIGINT) IS NULL THEN expires_at_ms "
                    "WHEN expires_at_ms IS NULL THEN enqueued_at_ms + ?1 "
                    "WHEN expires_at_ms < enqueued_at_ms + ?1 THEN expires_at_ms "
                    "ELSE enqueued_at_ms + ?1 END "
                    f"WHERE queue = ?2 AND state = '{state}'",
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
            await self.qdb.write(work, durable=True)
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
            if self.breakers.store.is_open and await self.probe_store():
                # Idle or not, the breaker closes once the store can write again.
                self.breakers.store.success()
            try:
                await self.sweep()
                since_purge += interval
                if since_purge >= purge_every:
                    since_purge = 0.0
                    cutoff = self.clock.now_ms() - self.config.server.retention_ms
                    await self.qdb.purge_finished(before_ms=cutoff)
            except TarryError as exc:
                self.breakers.store.failure(exc)
                log.warning("housekeeping failed: %s", exc)

    async def sweep(self) -> None:
        now = self.clock.now_ms()

        def work(conn: sqlite3.Connection) -> QueueTxn:
            txn = self._txn(conn, now)
            txn.sweep_expired()
            return txn

        if await self.qdb.read(lambda conn: self._txn(conn, now).has_expired()):
            self._after(await self.qdb.write(work))
        for name, entry in list(self.catalog.queues.items()):
            expires = entry.effective.expires_ms
            if (
                expires is not None
                and not self.waiters.count.get(name)
                and now - entry.last_used_ms >= expires
                and name != self.config.dispatch.error_queue
            ):
                await self._drop_queue(name, reason=f"expired after {expires} ms unused")

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
        open_names = self.breakers.open_names()
        if self.ingress is not None and not self.ingress.consuming:
            open_names.append("ingress")  # enabled, but not consuming from RabbitMQ now
        # Files a store found damaged (it serves the rest): named until an operator acts.
        damaged = list(getattr(self.store, "damaged", []))
        return {
            "status": "degraded" if open_names or damaged else "ok",
            "open": open_names,
            "breakers": self.breakers.snapshot(),
            # Why each open breaker is open ("disk full: the log store cannot write ...").
            "reasons": self.breakers.reasons(),
            "damaged": damaged,
        }

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
        def work(conn: sqlite3.Connection) -> dict[str, int]:
            return {
                s: n for s, n in conn.execute("SELECT state, count(*) FROM messages GROUP BY state")
            }

        by_state = await self.qdb.read(work)
        if not self.shared:
            by_state[MessageState.SCHEDULED.value] = await self.store.count_scheduled()
        d = self.dispatcher.stats
        return {
            "messages": {s.value: by_state.get(s.value, 0) for s in MessageState},
            "queues": len(self.catalog.queues),
            "topics": len(self.catalog.topics),
            "policies": len(self.catalog.policies),
            "routes": sorted(self.transports),
            "consumers_waiting": sum(self.waiters.count.values()),
            "dispatch": {
                "rounds": d.rounds,
                "released": d.released,
                "delivered": d.delivered,
                "failures": d.failures,
                "gave_up": d.gave_up,
                "held": d.held,
            },
            "store_commits": getattr(getattr(self.qdb, "db", None), "commits", 0),
            "journal_dropped": getattr(self.journal, "dropped", 0),
            # The log store's fsyncs, group commits and snapshot durations (``/metrics``).
            "store_write_path": write_path()
            if (write_path := getattr(self.store, "write_path", None))
            else None,
            "health": self.health(),
        }
