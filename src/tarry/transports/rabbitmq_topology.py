"""The native delay topology on a real broker: declare it, bind endpoints to it, and send into
it (the broker does the waiting). Names, keys and arguments come from ``tarry.model.topology``.

- ``declare_topology`` is idempotent: declaring again with the same prefix and queue type is a
  no-op; a different queue type (or other arguments) is refused with ``precondition_failed``,
  as RabbitMQ refuses it.
- ``NativeDelaySender.send`` rounds the delay up to whole seconds, publishes to the highest
  level the delay needs with ``mandatory`` and publisher confirms, and keeps the body, headers
  and properties intact. It binds the destination to the delivery exchange first (once), as
  NServiceBus does before every delayed send: its queue (routing topology ``direct``) or its
  exchange (``conventional``).
- On the wire everything is as NServiceBus.RabbitMQ writes it, AMQP types included
  (``DelayInfrastructure.cs``, ``BasicPropertiesExtensions.cs``): ``x-message-ttl`` a 64-bit
  long, the delay header a 32-bit int that keeps a negative value for a due time in the past,
  ``NServiceBus.TimeSent`` in NServiceBus's wire format, and a ``content_type``. Its
  ``delays migrate``/``transfer`` tools read exactly these.
- ``NativeDelayTransport`` is a route in ``mode = "native"``: the engine hands a message to it at
  send time, and RabbitMQ, not tarry's store, holds it until due (so tarry cannot cancel it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel

from tarry.config import RouteConfig
from tarry.errors import OptionsError, PreconditionFailed, UnknownDestination
from tarry.model.message import Message
from tarry.model.time import Clock, SystemClock
from tarry.model.topology import QueueType, RoutingTopology, Topology, delay_seconds_for
from tarry.transports.amqp_fields import FieldType, TypedMessage, declare_queue
from tarry.transports.rabbitmq import (
    AmqpLink,
    RabbitMQTransport,
    amqp_message,
    delivery_failed,
)

__all__ = [
    "CONTENT_TYPE_HEADER",
    "DEFAULT_CONTENT_TYPE",
    "DELAY_HEADER",
    "HEADER_TYPES",
    "QUEUE_ARGUMENT_TYPES",
    "TIME_SENT_HEADER",
    "NativeDelaySender",
    "NativeDelayTransport",
    "bind_endpoint",
    "declare_topology",
    "delete_topology",
    "nservicebus_time",
    "rabbitmq_transport",
    "topology_for",
]

#: NServiceBus's header with the requested delay in seconds; its tools read it as a 32-bit int.
DELAY_HEADER = "NServiceBus.Transport.RabbitMQ.DelayInSeconds"
#: When the message was sent; NServiceBus's tools add the delay to it to find the due time, and
#: move a delayed message without it to a poison queue.
TIME_SENT_HEADER = "NServiceBus.TimeSent"
#: NServiceBus's content type header, and what it sends when that is absent too.
CONTENT_TYPE_HEADER = "NServiceBus.ContentType"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
#: NServiceBus declares ``Convert.ToInt64(...) * 1000`` and writes ``Convert.ToInt32(delay)``;
#: its ``delays`` tools unbox the header with ``(int)``, which throws on any other type.
QUEUE_ARGUMENT_TYPES = {"x-message-ttl": FieldType.INT64}
HEADER_TYPES = {DELAY_HEADER: FieldType.INT32}
_INT32_MIN = -(1 << 31)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def nservicebus_time(ms: int) -> str:
    """NServiceBus's wire format for an instant (``DateTimeOffsetHelper``): UTC,
    ``yyyy-MM-dd HH:mm:ss:ffffff Z`` with a literal ``Z``."""
    at = _EPOCH + timedelta(milliseconds=ms)
    return f"{at:%Y-%m-%d %H:%M:%S}:{at.microsecond:06d} Z"


async def declare_topology(
    channel: AbstractChannel, topology: Topology, queue_type: QueueType
) -> None:
    """Declare every level's exchange and queue, the bindings, and the delivery exchange, in
    NServiceBus's order (highest level first). Raises ``precondition_failed`` when a queue
    exists with other arguments (e.g. the other queue type)."""
    exchanges = {}
    try:
        for level in range(topology.levels - 1, -1, -1):
            name = topology.level_name(level)
            exchange = await channel.declare_exchange(
                name, aio_pika.ExchangeType.TOPIC, durable=True
            )
            exchanges[level] = exchange
            await declare_queue(
                channel,
                name,
                durable=True,
                arguments=topology.queue_arguments(level, queue_type),
                field_types=QUEUE_ARGUMENT_TYPES,
            )
            queue = await channel.get_queue(name, ensure=False)
            await queue.bind(exchange, routing_key=topology.queue_binding_key(level))
        for level in range(topology.levels - 1, 0, -1):
            await exchanges[level - 1].bind(
                exchanges[level], routing_key=topology.pass_binding_key(level)
            )
        delivery = await channel.declare_exchange(
            topology.delivery_exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )
        await delivery.bind(exchanges[0], routing_key=topology.pass_binding_key(0))
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise PreconditionFailed(
            f"the delay topology {topology.prefix!r} exists with other arguments ({exc}); "
            f"declare it with the queue type it was created with, or delete it first"
        ) from exc


async def delete_topology(channel: AbstractChannel, topology: Topology) -> None:
    """Teardown in NServiceBus's order (tests use it to leave the shared broker clean)."""
    await channel.exchange_delete(topology.delivery_exchange)
    for level in range(topology.levels):
        await channel.queue_delete(topology.level_name(level))
        await channel.exchange_delete(topology.level_name(level))


async def bind_endpoint(
    channel: AbstractChannel,
    topology: Topology,
    queue: str,
    *,
    routing_topology: RoutingTopology = RoutingTopology.DIRECT,
) -> None:
    """Bind the endpoint ``queue`` to the delivery exchange with ``#.{queue}`` so delayed
    messages for it arrive there: the queue itself (``direct``), or the exchange of the same
    name (``conventional``, exchange to exchange). Raises ``unknown_destination`` when RabbitMQ
    has no such queue (or exchange)."""
    delivery = await channel.get_exchange(topology.delivery_exchange, ensure=False)
    key = topology.endpoint_binding_key(queue)
    if routing_topology is RoutingTopology.CONVENTIONAL:
        try:
            endpoint = await channel.declare_exchange(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise UnknownDestination(
                f"RabbitMQ has no exchange named {queue!r}; with routing topology conventional "
                "the endpoint's exchange is bound (a conventional NServiceBus endpoint declares "
                "it): declare it, or use routing topology direct"
            ) from exc
        await endpoint.bind(delivery, routing_key=key)
        return
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise UnknownDestination(
            f"RabbitMQ has no queue named {queue!r}; declare it (your endpoint does) first"
        ) from exc
    await declared.bind(delivery, routing_key=key)


class NativeDelaySender:
    """Publishes into a declared delay topology with publisher confirms."""

    def __init__(
        self,
        link: AmqpLink,
        topology: Topology,
        *,
        queue_type: QueueType = QueueType.QUORUM,
        declare: bool = True,
        routing_topology: RoutingTopology = RoutingTopology.DIRECT,
        clock: Clock | None = None,
    ) -> None:
        self.link = link
        self.topology = topology
        self.queue_type = queue_type
        self.declare = declare
        self.routing_topology = routing_topology
        self.clock: Clock = clock or SystemClock()
        self._ready = False
        self._bound: set[str] = set()
        self._setup = asyncio.Lock()

    def plan(self, delay_ms: int, address: str) -> tuple[str, str, int]:
        """(exchange, routing key, delay in s) for a send; ``invalid_argument`` past the max.
        The delay is negative for a due time in the past (the key then spells 0)."""
        delay_s = delay_seconds_for(delay_ms)
        key = self.topology.routing_key(delay_s, address)
        return self.topology.level_name(self.topology.starting_level(delay_s)), key, delay_s

    async def _prepare(self, address: str) -> None:
        if self._ready and address in self._bound:
            return
        async with self._setup:
            channel = await self.link.channel()
            if not self._ready and self.declare:
                await declare_topology(channel, self.topology, self.queue_type)
            self._ready = True
            if address not in self._bound:
                # A throwaway channel: a missing queue closes the channel it was asked on.
                side = await self.link.side_channel()
                try:
                    await bind_endpoint(
                        side, self.topology, address, routing_topology=self.routing_topology
                    )
                finally:
                    if not side.is_closed:
                        await side.close()
                self._bound.add(address)

    async def send(
        self,
        address: str,
        message: aio_pika.Message,
        *,
        delay_ms: int,
        now_ms: int | None = None,
    ) -> tuple[str, str]:
        """Publish ``message`` for ``address`` after ``delay_ms`` (rounded up to whole seconds),
        measured from ``now_ms`` (default: the clock's now), with NServiceBus's headers added;
        returns (exchange, routing key). Raises ``invalid_argument``, ``unknown_destination``,
        ``precondition_failed`` or ``DeliveryFailed``."""
        exchange, key, delay_s = self.plan(delay_ms, address)
        sent_at_ms = self.clock.now_ms() if now_ms is None else now_ms
        headers = dict(message.headers or {})
        # A due time decades in the past is due now all the same; int32 is the header's type.
        headers[DELAY_HEADER] = max(delay_s, _INT32_MIN)
        # The moment the delay was measured from, so TimeSent + delay is the due time.
        headers[TIME_SENT_HEADER] = nservicebus_time(sent_at_ms)
        typed = TypedMessage.from_message(message, headers=headers, field_types=HEADER_TYPES)
        if not typed.content_type:
            # As NServiceBus fills it: its content type header, else a neutral default.
            named = headers.get(CONTENT_TYPE_HEADER)
            typed.content_type = named if isinstance(named, str) and named else DEFAULT_CONTENT_TYPE
        try:
            await self._prepare(address)
        except (UnknownDestination, PreconditionFailed):
            raise
        except Exception as exc:
            raise delivery_failed(f"the delay topology {self.topology.prefix!r}", exc) from exc
        await self.link.publish(exchange, key, typed)
        return exchange, key


def topology_for(route: RouteConfig) -> Topology:
    return Topology(prefix=route.prefix, levels=route.levels)


class NativeDelayTransport:
    """A route in ``mode = "native"``: ``holds_waiting`` tells the engine to hand messages over
    at send time; RabbitMQ waits, tarry keeps only a record (state ``delivered``)."""

    #: The engine publishes at send time instead of keeping the message until due.
    holds_waiting = True

    def __init__(self, name: str, route: RouteConfig, *, clock: Clock | None = None) -> None:
        self.name = name
        self.route = route
        self.clock: Clock = clock or SystemClock()
        self.address = route.routing_key or name
        self.link = AmqpLink(route.url, timeout_ms=route.timeout_ms, name=f"tarry route {name}")
        self.sender = NativeDelaySender(
            self.link,
            topology_for(route),
            queue_type=QueueType(route.queue_type),
            declare=route.declare_topology,
            routing_topology=RoutingTopology(route.routing_topology),
            clock=self.clock,
        )

    async def deliver(self, message: Message) -> None:
        now = self.clock.now_ms()
        delay_ms = message.deliver_at_ms - now
        if delay_ms > 0 and message.expires_at_ms is not None:
            # A per-message expiration in a delay queue would cut the wait short: the message
            # would be dead-lettered onwards, and delivered, early (NServiceBus refuses it too).
            raise OptionsError(
                f"route {self.name!r} hands the waiting to RabbitMQ (mode native), which cannot "
                "combine a delay with ttl_ms; drop ttl_ms or use a route with mode = store"
            )
        extra: Mapping[str, Any] = self.route.headers
        await self.sender.send(
            self.address,
            amqp_message(message, now_ms=now, extra_headers=extra),
            delay_ms=delay_ms,
            now_ms=now,
        )

    async def close(self) -> None:
        await self.link.close()


def rabbitmq_transport(
    name: str, route: RouteConfig, *, clock: Clock | None = None
) -> RabbitMQTransport | NativeDelayTransport:
    """The transport for a ``transport = "rabbitmq"`` route, by its ``mode``."""
    if route.mode == "native":
        return NativeDelayTransport(name, route, clock=clock)
    return RabbitMQTransport(name, route, clock=clock)
