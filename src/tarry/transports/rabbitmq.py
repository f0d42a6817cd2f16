"""RabbitMQ as a destination of tarry's own store, and the one connection helper every RabbitMQ
part of tarry uses (the native delay topology, the ingress, the CLI).

- ``AmqpLink`` owns one connection and one channel with publisher confirms, (re)connects on
  demand, and publishes with ``mandatory`` set: a publish returns only once RabbitMQ confirmed
  it, and a message no queue would take is refused instead of silently dropped.
- ``RabbitMQTransport`` (route ``transport = "rabbitmq"``, ``mode = "store"``): tarry keeps the
  message until it falls due, then publishes it to ``exchange``/``routing_key``; the dispatcher
  removes it from the store only after the confirm. The time left before ``expires_at`` goes
  into the ``expiration`` property, so the message never lives in RabbitMQ past its expiry.
- aio-pika's and aiormq's exceptions become ``DeliveryFailed`` in one place,
  ``delivery_failed``. Failures of RabbitMQ itself (down, unreachable, blocking publishers past
  the route's timeout) carry ``outage=True``: the dispatcher then holds the message back
  without counting an attempt, so nothing goes to the error queue while the broker is away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from tarry.config import RouteConfig
from tarry.errors import DeliveryFailed
from tarry.model.message import Message
from tarry.model.time import Clock, SystemClock

__all__ = ["AmqpLink", "RabbitMQTransport", "amqp_message", "delivery_failed"]

log = logging.getLogger(__name__)

#: After a failed connect, fail fast for this long instead of trying again per message.
RECONNECT_BACKOFF_S = 1.0


def delivery_failed(target: str, exc: BaseException) -> DeliveryFailed:
    """aio-pika's and aiormq's failures, once. ``outage`` marks the broker being away (retry
    later, without counting it against the message); the rest are about the message itself."""
    if isinstance(exc, aio_pika.exceptions.DeliveryError):
        frame = getattr(exc, "frame", None)
        if isinstance(frame, aiormq.spec.Basic.Return):
            return DeliveryFailed(
                f"RabbitMQ could not route the message to {target} "
                f"({frame.reply_code} {frame.reply_text}); bind a queue for it",
                reason="unroutable",
                permanent=False,
            )
        return DeliveryFailed(
            f"RabbitMQ refused the message for {target} (negative confirm); "
            "a queue is full or failing",
            reason="nacked",
            permanent=False,
        )
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        return DeliveryFailed(
            f"{target} does not exist in RabbitMQ: {exc}; declare it",
            reason="not_found",
            permanent=False,
        )
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return DeliveryFailed(
            f"RabbitMQ refused the message for {target}: {exc}", reason="refused", permanent=True
        )
    if isinstance(exc, TimeoutError):
        return DeliveryFailed(
            f"RabbitMQ did not confirm the message for {target} in time (down, or blocking "
            "publishers)",
            reason="timeout",
            permanent=False,
            outage=True,
        )
    if isinstance(exc, aiormq.exceptions.ChannelInvalidStateError):
        # Publishing on a channel that closed under us: its connection died.
        return DeliveryFailed(
            f"the connection to RabbitMQ was lost publishing to {target}: {exc}",
            reason="connection_lost",
            permanent=False,
            outage=True,
        )
    if isinstance(exc, aiormq.exceptions.AMQPChannelError):
        return DeliveryFailed(
            f"RabbitMQ closed the channel publishing to {target}: {exc}",
            reason="channel_closed",
            permanent=False,
        )
    if isinstance(
        exc, aiormq.exceptions.AuthenticationError | aiormq.exceptions.ProbableAuthenticationError
    ):
        return DeliveryFailed(
            f"RabbitMQ refused tarry's credentials for {target}: {exc}; fix the URL",
            reason="authentication",
            permanent=False,
            outage=True,
        )
    if isinstance(exc, ConnectionError | OSError | aiormq.exceptions.AMQPConnectionError):
        return DeliveryFailed(
            f"cannot reach RabbitMQ ({target}): {exc or type(exc).__name__}",
            reason="connect",
            permanent=False,
            outage=True,
        )
    return DeliveryFailed(
        f"publishing to {target} failed: {exc!r}", reason="amqp_error", permanent=False
    )


class AmqpLink:
    """One robust-enough AMQP connection with a publisher-confirm channel, opened lazily."""

    def __init__(self, url: str, *, timeout_ms: int = 5_000, name: str = "tarry") -> None:
        self.url = url
        self.timeout_s = timeout_ms / 1000
        self.name = name
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._lock = asyncio.Lock()
        self._down_until = 0.0
        self._last_error: BaseException | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._closing: set[asyncio.Task[Any]] = set()

    async def channel(self) -> AbstractChannel:
        """The open confirm channel; connects when there is none. Raises aio-pika's errors."""
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return channel
        async with self._lock:
            if self._channel is not None and not self._channel.is_closed:
                return self._channel
            loop = asyncio.get_running_loop()
            if loop.time() < self._down_until and self._last_error is not None:
                raise self._last_error
            self._abandon()
            try:
                self._connection, self._channel = await self._connect()
            except Exception as exc:
                self._down_until = loop.time() + RECONNECT_BACKOFF_S
                self._last_error = exc
                self._abandon()
                raise
            self._last_error = None
            return self._channel

    async def _connect(self) -> tuple[AbstractConnection, AbstractChannel]:
        """Connect in a task of its own and stop waiting after the timeout: a handshake cut
        off half-way can leave aio-pika waiting in a way a timeout cannot cancel, and that
        must not hold the lock (and every publish behind it) for ever."""

        async def connect() -> tuple[AbstractConnection, AbstractChannel]:
            connection = await aio_pika.connect(
                self.url, client_properties={"connection_name": self.name}
            )
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            return connection, channel

        task = asyncio.get_running_loop().create_task(connect())
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            task.cancel()
            self._closing.add(task)

            def late(finished: asyncio.Task[Any]) -> None:
                self._closing.discard(finished)
                if not finished.cancelled() and finished.exception() is None:
                    connection, _ = finished.result()  # connected after all: close it
                    closing = asyncio.get_running_loop().create_task(
                        self._close_quietly(connection)
                    )
                    self._closing.add(closing)
                    closing.add_done_callback(self._closing.discard)

            task.add_done_callback(late)
            raise TimeoutError(f"connecting to RabbitMQ took over {self.timeout_s} s")
        return task.result()

    async def side_channel(self) -> AbstractChannel:
        """A fresh plain channel on the same connection, for operations that may close it
        (a passive declare of a missing queue); the caller closes it."""
        await self.channel()
        assert self._connection is not None
        return await self._connection.channel()

    async def exchange(self, name: str) -> AbstractExchange:
        channel = await self.channel()
        exchange = self._exchanges.get(name)  # cleared whenever the channel is replaced
        if exchange is None:
            if name == "":
                exchange = channel.default_exchange
            else:
                exchange = await channel.get_exchange(name, ensure=False)
            self._exchanges[name] = exchange
        return exchange

    async def publish(self, exchange: str, routing_key: str, message: aio_pika.Message) -> None:
        """Publish with ``mandatory`` and wait for the confirm; raises ``DeliveryFailed``."""
        target = f"exchange {exchange or '(default)'!r} key {routing_key!r}"
        used: list[AbstractConnection | None] = [None]

        async def publish() -> None:
            target_exchange = await self.exchange(exchange)
            used[0] = self._connection
            # While RabbitMQ blocks publishers (a resource alarm), write nothing: a frame
            # written now would still go out after the alarm, as a duplicate of the retry.
            await self._unblocked()
            await target_exchange.publish(message, routing_key=routing_key, mandatory=True)

        # In a task of its own, waited for at most the timeout: on a connection that died
        # half-way, aio-pika can wait in a way that a cancelling timeout does not end.
        task = asyncio.get_running_loop().create_task(publish())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            if not done:
                task.cancel()
                self._closing.add(task)
                task.add_done_callback(_settled(self._closing))
                raise TimeoutError()
            task.result()
        except Exception as exc:
            failure = delivery_failed(target, exc)
            if isinstance(exc, TimeoutError):
                self._abandon()
            elif used[0] is not None and (used[0] is not self._connection or used[0].is_closed):
                # The connection went away under this publish (RabbitMQ closed it, or another
                # publish timed out and dropped it): the broker is the problem, not the message.
                failure = DeliveryFailed(
                    f"the connection to RabbitMQ was lost publishing to {target}: {exc!r}",
                    reason="connection_lost",
                    permanent=False,
                    outage=True,
                )
            raise failure from exc

    async def _unblocked(self) -> None:
        connection = self._connection
        transport = getattr(connection, "transport", None)
        if transport is not None:
            await transport.connection.ready()

    def _abandon(self) -> None:
        """Stop using the current connection; it is closed in the background. Never awaited
        inline: closing a broken or blocked connection can hang (a blocked one cannot even
        close until the alarm clears), and must not hold up the next connect."""
        connection, self._connection, self._channel = self._connection, None, None
        self._exchanges.clear()
        if connection is not None and not connection.is_closed:
            task = asyncio.get_running_loop().create_task(self._close_quietly(connection))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_quietly(connection: AbstractConnection) -> None:
        try:
            await connection.close()
        except Exception:  # already broken: nothing more to release
            log.debug("closing an abandoned AMQP connection failed", exc_info=True)

    async def close(self) -> None:
        """Close the connection; waits at most ``timeout`` for the broker to agree."""
        self._abandon()
        if self._closing:
            _, pending = await asyncio.wait(set(self._closing), timeout=self.timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=0.1)


def _settled(tasks: set[asyncio.Task[Any]]) -> Any:
    """A done-callback for a task nobody awaits: forget it and read its outcome (so asyncio
    does not report an exception that was never retrieved)."""

    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return done


def amqp_message(
    message: Message, *, now_ms: int, extra_headers: Mapping[str, Any] | None = None
) -> aio_pika.Message:
    """The AMQP form of a tarry message: body, headers and content type kept, ``message_id``
    and ``correlation_id`` in their properties, tarry's own facts in ``tarry-*`` headers, and
    the time left before ``expires_at`` in ``expiration`` (ms, as RabbitMQ reads it)."""
    headers: dict[str, Any] = dict(message.headers)
    content_type = headers.pop("content-type", None)
    headers.update(
        {
            "tarry-id": message.id,
            "tarry-destination": message.destination,
            "tarry-deliver-at": message.deliver_at_ms,
            "tarry-sent-at": message.sent_at_ms,
        }
    )
    headers.update(extra_headers or {})
    expiration: int | None = None
    if message.expires_at_ms is not None:
        # Time already spent waiting is subtracted; at least 1 ms (0 would mean "only if a
        # consumer is waiting", which is not what an unexpired message asked for).
        expiration = max(1, message.expires_at_ms - now_ms)
    return aio_pika.Message(
        body=message.body,
        headers=headers,
        content_type=content_type,
        message_id=message.message_id or message.id,
        correlation_id=message.correlation_id,
        delivery_mode=(
            aio_pika.DeliveryMode.PERSISTENT
            if message.persistent
            else aio_pika.DeliveryMode.NOT_PERSISTENT
        ),
        expiration=expiration / 1000 if expiration is not None else None,
        timestamp=message.sent_at_ms / 1000,
    )


def check_not_expired(message: Message, now_ms: int) -> None:
    if message.expires_at_ms is not None and message.expires_at_ms <= now_ms:
        raise DeliveryFailed(
            f"message {message.id} expired at {message.expires_at_ms} before it could be "
            "published; it is never delivered after expires_at",
            reason="expired",
            permanent=True,
        )


class RabbitMQTransport:
    """Route ``mode = "store"``: publish a due message to ``exchange`` with ``routing_key``
    (default: the route's name) and return after RabbitMQ's confirm."""

    def __init__(self, name: str, route: RouteConfig, *, clock: Clock | None = None) -> None:
        self.name = name
        self.route = route
        self.clock: Clock = clock or SystemClock()
        self.link = AmqpLink(route.url, timeout_ms=route.timeout_ms, name=f"tarry route {name}")

    async def deliver(self, message: Message) -> None:
        now = self.clock.now_ms()
        check_not_expired(message, now)
        await self.link.publish(
            self.route.exchange,
            self.route.routing_key or self.name,
            amqp_message(message, now_ms=now, extra_headers=self.route.headers),
        )

    async def deliver_batch(self, messages: Sequence[Message]) -> list[DeliveryFailed | None]:
        """All at once on the confirm channel: RabbitMQ confirms them as a pipeline."""

        async def one(message: Message) -> DeliveryFailed | None:
            try:
                await self.deliver(message)
            except DeliveryFailed as exc:
                return exc
            return None

        return list(await asyncio.gather(*(one(m) for m in messages)))

    async def close(self) -> None:
        await self.link.close()
