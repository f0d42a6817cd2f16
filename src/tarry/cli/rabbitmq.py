"""``tarry rabbitmq declare|bind|send``: the native delay topology, straight on RabbitMQ (no
tarry server involved; the broker does the waiting)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import click

from tarry.cli.context import parsed, reports_errors
from tarry.cli.messages import header_pairs
from tarry.cli.output import print_json
from tarry.errors import DeliveryFailed, TarryError, Unavailable
from tarry.model.time import SystemClock, parse_duration_ms, parse_instant_ms
from tarry.model.topology import (
    DEFAULT_LEVELS,
    DEFAULT_PREFIX,
    QueueType,
    RoutingTopology,
    Topology,
)

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def topology_options(func: Callable[P, R]) -> Callable[P, R]:
    func = click.option(
        "--levels",
        type=int,
        default=DEFAULT_LEVELS,
        show_default=True,
        help="Delay levels; the longest delay is 2^levels - 1 s (always 28 with nsb.v2).",
    )(func)
    func = click.option(
        "--prefix",
        default=DEFAULT_PREFIX,
        show_default=True,
        help="Name prefix; 'nsb.v2' is NServiceBus's own topology.",
    )(func)
    return click.option(
        "--url",
        "amqp_url",
        envvar="TARRY_AMQP_URL",
        default=DEFAULT_AMQP_URL,
        show_default=True,
        help="The RabbitMQ server (env TARRY_AMQP_URL).",
    )(func)


def routing_topology_option(func: Callable[P, R]) -> Callable[P, R]:
    return click.option(
        "--routing-topology",
        type=click.Choice([t.value for t in RoutingTopology]),
        default=RoutingTopology.DIRECT.value,
        show_default=True,
        help="direct: bind the endpoint's queue; conventional: bind its exchange of the same "
        "name (exchange to exchange), as NServiceBus's conventional routing topology does.",
    )(func)


def _run(amqp_url: str, work: Callable[[], Awaitable[R]]) -> R:
    """Run ``work``; RabbitMQ being away is ``unavailable`` (exit 3), like tarry being away."""
    from tarry.config import redact_url
    from tarry.transports.rabbitmq import delivery_failed

    # The libraries' own complaints would repeat, less clearly, the one line we print.
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    async def main() -> R:
        try:
            return await work()
        except TarryError:
            raise
        except Exception as exc:
            raise delivery_failed(redact_url(amqp_url), exc) from exc

    try:
        return asyncio.run(main())
    except DeliveryFailed as exc:
        if exc.details.get("outage"):
            raise Unavailable(exc.message) from exc
        raise


@click.group()
def rabbitmq() -> None:
    """The RabbitMQ native delay topology (NServiceBus's 28 levels): declare, bind, send."""


@rabbitmq.command()
@topology_options
@click.option(
    "--queue-type",
    type=click.Choice([t.value for t in QueueType]),
    default=QueueType.QUORUM.value,
    show_default=True,
    help="quorum: at-least-once between levels; classic: lighter, at most once.",
)
@reports_errors
def declare(amqp_url: str, prefix: str, levels: int, queue_type: str) -> None:
    """Declare the delay topology, idempotently: per level a topic exchange and a queue
    (x-message-ttl 2^N s, dead-lettering to level N-1), and the delivery exchange."""
    from tarry.transports.rabbitmq import AmqpLink
    from tarry.transports.rabbitmq_topology import declare_topology

    topology = parsed(Topology, prefix=prefix, levels=levels)

    async def work() -> None:
        link = AmqpLink(amqp_url, name="tarry rabbitmq declare")
        try:
            await declare_topology(await link.channel(), topology, QueueType(queue_type))
        finally:
            await link.close()

    _run(amqp_url, work)
    print_json(
        {
            "prefix": prefix,
            "levels": levels,
            "queue_type": queue_type,
            "delivery_exchange": topology.delivery_exchange,
            "max_delay_s": topology.max_delay_s,
        }
    )


@rabbitmq.command()
@click.argument("queue")
@topology_options
@routing_topology_option
@reports_errors
def bind(queue: str, amqp_url: str, prefix: str, levels: int, routing_topology: str) -> None:
    """Bind an endpoint's QUEUE (or, conventional, its exchange of that name) to the delivery
    exchange (key '#.QUEUE')."""
    from tarry.transports.rabbitmq import AmqpLink
    from tarry.transports.rabbitmq_topology import bind_endpoint

    topology = parsed(Topology, prefix=prefix, levels=levels)
    how = RoutingTopology(routing_topology)

    async def work() -> None:
        link = AmqpLink(amqp_url, name="tarry rabbitmq bind")
        try:
            await bind_endpoint(await link.side_channel(), topology, queue, routing_topology=how)
        finally:
            await link.close()

    _run(amqp_url, work)
    print_json(
        {
            "queue": queue,
            "exchange": topology.delivery_exchange,
            "key": topology.endpoint_binding_key(queue),
            "bound": "queue" if how is RoutingTopology.DIRECT else "exchange",
        }
    )


@rabbitmq.command("send")
@click.argument("queue")
@click.argument("body")
@click.option("--delay", help="Deliver after this long (rounded up to whole seconds): 5s, 10m.")
@click.option("--at", "at", help="Deliver at this time: RFC 3339 or epoch ms.")
@click.option("-H", "--header", "headers", multiple=True, help="A header, key=value (repeatable).")
@click.option("--id", "message_id", help="The AMQP message_id property.")
@click.option("--correlation-id", help="The AMQP correlation_id property.")
@click.option(
    "--content-type", help="The AMQP content_type property (default application/octet-stream)."
)
@topology_options
@routing_topology_option
@reports_errors
def send_native(
    queue: str,
    body: str,
    delay: str | None,
    at: str | None,
    headers: tuple[str, ...],
    message_id: str | None,
    correlation_id: str | None,
    content_type: str | None,
    amqp_url: str,
    prefix: str,
    levels: int,
    routing_topology: str,
) -> None:
    """Publish BODY for QUEUE into the delay topology, with publisher confirms and
    NServiceBus's headers; RabbitMQ holds it until due. Prints the exchange, routing key and
    the level queues it will wait in."""
    import aio_pika

    from tarry.transports.rabbitmq import AmqpLink
    from tarry.transports.rabbitmq_topology import NativeDelaySender

    if delay is not None and at is not None:
        raise click.UsageError("give --delay or --at, not both")
    delay_ms = 0
    now_ms = SystemClock().now_ms()
    if delay is not None:
        delay_ms = parsed(parse_duration_ms, delay, field="--delay")
    elif at is not None:
        delay_ms = parsed(parse_instant_ms, at, field="--at") - now_ms
    topology = parsed(Topology, prefix=prefix, levels=levels)
    # A delay past the maximum is a command-line error (exit 2), found before connecting.
    exchange, key, delay_s = parsed(
        NativeDelaySender(AmqpLink(amqp_url), topology, declare=False).plan, delay_ms, queue
    )
    message = aio_pika.Message(
        body=body.encode("utf-8"),
        headers=dict(header_pairs(headers)),
        message_id=message_id,
        correlation_id=correlation_id,
        content_type=content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )

    async def work() -> dict[str, Any]:
        link = AmqpLink(amqp_url, name="tarry rabbitmq send")
        sender = NativeDelaySender(
            link, topology, declare=False, routing_topology=RoutingTopology(routing_topology)
        )
        try:
            await sender.send(queue, message, delay_ms=delay_ms, now_ms=now_ms)
        finally:
            await link.close()
        return {
            "queue": queue,
            "exchange": exchange,
            "routing_key": key,
            "delay_s": delay_s,
            "waits_in": topology.path(key, topology.starting_level(delay_s))[:-1],
        }

    print_json(_run(amqp_url, work))
