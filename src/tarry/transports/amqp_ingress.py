"""Scheduling from any AMQP client: tarry consumes ``[rabbitmq] ingress_queue`` (default
``tarry.schedule``) and schedules what arrives there.

A producer in any language publishes the body it wants delivered, with headers:

==========================  ==============================================================
``tarry-destination``       required: the queue, topic or route to deliver to
``tarry-delay``             a duration (``5s``, ``250ms``, ``10m``) or whole milliseconds
``x-delay``                 whole milliseconds (what RabbitMQ's delayed-message plugin reads)
``tarry-deliver-at``        an RFC 3339 time or epoch milliseconds (instead of a delay)
``tarry-ttl``               a duration or milliseconds, counted from the send
``tarry-reply-to``,         as the HTTP API's ``reply_to``, ``report`` (comma-separated) and
``tarry-report``,           ``on_undeliverable``
``tarry-on-undeliverable``
==========================  ==============================================================

The ``message_id`` and ``correlation_id`` properties become the message's (so a repeated
``message_id`` is stored once), ``content_type`` becomes the ``content-type`` header, and every
other header is carried along as text.

Guarantees: the message goes through the same rules as ``POST /v1/messages`` (the engine's send
path and ``tarry.model.validate``), with the permissions of ``[rabbitmq] ingress_token`` on a
server with tokens (``send_batch`` comes scoped: ``tarry.engine.lifecycle.ingress_sends``), and
is acked only after tarry stored it durably. One that
breaks a rule is published, with publisher confirms, to ``dead_letter_exchange`` carrying
``tarry-error-code`` and ``tarry-error-message`` headers, and only then acked. When the store
cannot accept (``unavailable``), the server is behind on releases (``overloaded``: the ingress
then waits the refusal's ``retry_after_s``), or the reject cannot be published, the message is
returned to the queue (``nack`` with requeue) and tried again: never dropped, never acked before
durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
import orjson
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from tarry.config import RabbitMQConfig
from tarry.errors import InvalidArgument, Overloaded, TarryError, Unavailable
from tarry.model.time import parse_duration_ms, whole_number

__all__ = ["AmqpIngress", "IngressStats", "send_fields"]

log = logging.getLogger(__name__)

#: The engine's ``send_batch``: one result (or ``TarryError``) per item, in order.
SendBatch = Callable[[Sequence[Mapping[str, Any]]], Awaitable[Sequence[object]]]

ERROR_CODE_HEADER = "tarry-error-code"
ERROR_MESSAGE_HEADER = "tarry-error-message"
#: Headers that steer scheduling: they become send fields, not message headers.
_CONTROL = {
    "tarry-destination": "destination",
    "tarry-delay": "delay_ms",
    "x-delay": "delay_ms",
    "tarry-deliver-at": "deliver_at",
    "tarry-ttl": "ttl_ms",
    "tarry-reply-to": "reply_to",
    "tarry-report": "report",
    "tarry-on-undeliverable": "on_undeliverable",
}
#: What RabbitMQ adds on its own; not the producer's headers.
_BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-", ERROR_CODE_HEADER)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return orjson.dumps(value, default=str).decode()


def _duration(header: str, value: Any) -> int:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgument(
            f"header {header} must be whole milliseconds or a duration such as 5s, got {value!r}"
        )
    if isinstance(value, str) and (number := whole_number(value)) is not None:
        value = number
    if isinstance(value, int) and value < 0:
        raise InvalidArgument(f"header {header} ({value}) must not be negative")
    return parse_duration_ms(value, field=f"header {header}")


def send_fields(
    body: bytes,
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None = None,
    correlation_id: str | None = None,
    content_type: str | None = None,
) -> dict[str, Any]:
    """An AMQP message as the fields of ``POST /v1/messages`` (syntax only; the engine's send
    path applies the rules). Raises ``invalid_argument`` for unreadable control headers."""
    fields: dict[str, Any] = {"body": body}
    carried: dict[str, str] = {}
    for key, value in (headers or {}).items():
        name = key.lower()
        target = _CONTROL.get(name)
        if target is None:
            if not name.startswith(_BROKER_HEADERS):
                carried[key] = _text(value)
            continue
        if target in fields:
            raise InvalidArgument(
                f"header {key} repeats {target}; give one of tarry-delay, x-delay"
            )
        if target in ("delay_ms", "ttl_ms"):
            fields[target] = _duration(key, value)
        elif target == "deliver_at":
            text = _text(value).strip()
            number = whole_number(text)
            fields[target] = text if number is None else number
        elif target == "report":
            fields[target] = [r.strip() for r in _text(value).split(",") if r.strip()]
        else:
            fields[target] = _text(value)
    if "destination" not in fields:
        raise InvalidArgument(
            "header tarry-destination is required: name the queue, topic or route to deliver to"
        )
    if content_type:
        carried.setdefault("content-type", content_type)
    if carried:
        fields["headers"] = carried
    if message_id:
        fields["message_id"] = message_id
    if correlation_id:
        fields["correlation_id"] = correlation_id
    return fields


@dataclass(slots=True)
class IngressStats:
    accepted: int = 0
    rejected: int = 0
    requeued: int = 0


class AmqpIngress:
    """Consumes the ingress queue and schedules through ``send_batch`` (the engine's)."""

    def __init__(self, config: RabbitMQConfig, *, send_batch: SendBatch) -> None:
        self.config = config
        self._send_batch = send_batch
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._connection: AbstractRobustConnection | None = None
        self._dead_letters: aio_pika.abc.AbstractExchange | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = IngressStats()
        self.ready = asyncio.Event()

    @property
    def consuming(self) -> bool:
        """Connected and consuming (``/healthz`` reports ``ingress`` as open otherwise)."""
        connection = self._connection
        return connection is not None and not connection.is_closed

    async def start(self) -> None:
        """Connect, declare, and consume in the background (retrying while RabbitMQ is away)."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._run()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._connection is not None:
            # Unacked messages return to the queue. A broken connection may not close
            # promptly: wait a bounded time, the socket goes with the process otherwise.
            closing = asyncio.ensure_future(self._connection.close())
            self._connection = None
            _, pending = await asyncio.wait({closing}, timeout=self.config.timeout_ms / 1000)
            for task in pending:
                task.cancel()

    async def _run(self) -> None:
        while self._connection is None:
            try:
                await self._connect()
            except (OSError, aiormq.exceptions.AMQPError, TimeoutError) as exc:
                log.warning("AMQP ingress cannot connect to RabbitMQ (%s); retrying in 1 s", exc)
                await asyncio.sleep(1)
        log.info("AMQP ingress consuming %s", self.config.ingress_queue)
        self.ready.set()
        await self._work()

    async def _connect(self) -> None:
        cfg = self.config
        connection = await asyncio.wait_for(
            aio_pika.connect_robust(
                cfg.url, client_properties={"connection_name": "tarry ingress"}
            ),
            cfg.timeout_ms / 1000,
        )
        try:
            publish = await connection.channel(publisher_confirms=True, on_return_raises=True)
            self._dead_letters = await publish.declare_exchange(
                cfg.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
            )
            if cfg.dead_letter_queue:
                rejected = await publish.declare_queue(cfg.dead_letter_queue, durable=True)
                await rejected.bind(self._dead_letters)
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=cfg.prefetch)
            name = await self._declare_ingress(connection)
            queue = await consume.get_queue(name, ensure=False)
            await queue.consume(self._inbox.put)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection

    async def _declare_ingress(self, connection: AbstractRobustConnection) -> str:
        """Declare the ingress queue; one that exists with other arguments is used as it is."""
        name = self.config.ingress_queue
        channel = await connection.channel()
        try:
            await channel.declare_queue(
                name, durable=True, arguments={"x-queue-type": self.config.queue_type}
            )
        except aiormq.exceptions.ChannelPreconditionFailed:
            channel = await connection.channel()
            await channel.declare_queue(name, passive=True)
        finally:
            if not channel.is_closed:
                await channel.close()
        return name

    async def _work(self) -> None:
        while True:
            batch = [await self._inbox.get()]
            while len(batch) < self.config.prefetch and not self._inbox.empty():
                batch.append(self._inbox.get_nowait())
            try:
                await self.handle(batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Typically the channel closed under us (RabbitMQ restarting): whatever was not
                # acked is redelivered by RabbitMQ once the robust connection is back.
                log.exception("AMQP ingress could not settle a batch of %d", len(batch))
                await asyncio.sleep(1)

    async def handle(self, batch: Sequence[AbstractIncomingMessage]) -> None:
        """Schedule a batch: store the valid ones in one durable write, then settle each."""
        fields: list[dict[str, Any]] = []
        sent: list[AbstractIncomingMessage] = []
        for message in batch:
            try:
                fields.append(
                    send_fields(
                        message.body,
                        message.headers,
                        message_id=message.message_id,
                        correlation_id=message.correlation_id,
                        content_type=message.content_type,
                    )
                )
                sent.append(message)
            except TarryError as exc:
                await self._reject(message, exc)
        if not fields:
            return
        try:
            results = await self._send_batch(fields)
        except (Unavailable, Overloaded) as exc:  # cannot take work now: the whole batch waits
            results = [exc] * len(fields)
        except TarryError:
            # Refused as a batch (e.g. larger than the server's max_batch): judge each alone,
            # so one message's verdict never depends on its neighbours.
            results = []
            for one in fields:
                try:
                    results.extend(await self._send_batch([one]))
                except TarryError as exc:
                    results.append(exc)
        pause_s = 0
        for message, result in zip(sent, results, strict=True):
            if isinstance(result, (Unavailable, Overloaded)):
                await message.nack(requeue=True)
                self.stats.requeued += 1
                # Overloaded: wait as long as the server asks (releases are behind).
                pause_s = max(pause_s, getattr(result, "retry_after_s", 1))
            elif isinstance(result, TarryError):
                await self._reject(message, result)
            else:
                await message.ack()
                self.stats.accepted += 1
        if pause_s:
            # The server is not taking work now: do not spin on redeliveries.
            await asyncio.sleep(pause_s)

    async def _reject(self, message: AbstractIncomingMessage, error: TarryError) -> None:
        """Publish a copy, with the error, to the dead-letter exchange; ack only once it is
        confirmed there. If that fails, requeue: the message is never silently dropped."""
        headers = dict(message.headers or {})
        headers[ERROR_CODE_HEADER] = error.code
        headers[ERROR_MESSAGE_HEADER] = error.message
        headers["tarry-rejected-from"] = self.config.ingress_queue
        copy = aio_pika.Message(
            body=message.body,
            headers=headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            assert self._dead_letters is not None
            await self._dead_letters.publish(
                copy, routing_key=message.routing_key or "", mandatory=True
            )
        except Exception as exc:
            log.error(
                "cannot publish a rejected message to %s (%s); returned to %s",
                self.config.dead_letter_exchange,
                exc,
                self.config.ingress_queue,
            )
            await message.nack(requeue=True)
            self.stats.requeued += 1
            await asyncio.sleep(1)
            return
        await message.ack()
        self.stats.rejected += 1
        log.info("AMQP ingress rejected a message: %s", error)
