"""The native delay topology on the real RabbitMQ: where each delay lands (checked through the
routing key and the queue it lands in, not by waiting), NServiceBus interop, queue types."""

from __future__ import annotations

import time

import aio_pika
import pytest

from tarry.errors import InvalidArgument, PreconditionFailed, UnknownDestination
from tarry.model.topology import QueueType, Topology
from tarry.transports.rabbitmq import AmqpLink
from tarry.transports.rabbitmq_topology import (
    DELAY_HEADER,
    NativeDelaySender,
    declare_topology,
)
from tests.transports.conftest import Broker

pytestmark = pytest.mark.rabbitmq
MAX = (1 << 28) - 1


def wait_for(predicate, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def declare_endpoint(broker: Broker, queue: str) -> None:
    with broker.blocking() as connection:
        connection.channel().queue_declare(queue, durable=True)


async def test_each_delay_lands_in_the_level_queue_its_routing_key_names(broker: Broker) -> None:
    # Given the topology and an endpoint queue
    topology = Topology(prefix="tarry")
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, topology, queue_type=QueueType.QUORUM)
    declare_endpoint(broker, "orders")
    try:
        # When messages are sent with delays of 0 s, 1 s, 5 s, 37 s and just under the maximum
        cases = {
            0: ("tarry.delay-level-00", None),
            1_000: ("tarry.delay-level-00", "tarry.delay-level-00"),
            5_000: ("tarry.delay-level-02", "tarry.delay-level-02"),
            37_000: ("tarry.delay-level-05", "tarry.delay-level-05"),
            (MAX - 1) * 1000: ("tarry.delay-level-27", "tarry.delay-level-27"),
        }
        for delay_ms, (exchange, lands_in) in cases.items():
            before = broker.count(lands_in) if lands_in else 0
            sent_exchange, key = await sender.send(
                "orders", aio_pika.Message(f"after {delay_ms}".encode()), delay_ms=delay_ms
            )
            # Then it was published to the starting level's exchange with the binary key ...
            assert sent_exchange == exchange
            assert key == topology.routing_key(delay_ms // 1000, "orders")
            # ... and sits in the queue of its highest set bit (0 s goes straight through)
            if lands_in is None:
                _, _, body = broker.get("orders")
                assert body == b"after 0"
            else:
                wait_for(lambda q=lands_in, b=before: broker.count(q) == b + 1)
        assert topology.path(topology.routing_key(5, "orders"), 2)[:-1] == [
            "tarry.delay-level-02",
            "tarry.delay-level-00",
        ]
        assert topology.path(topology.routing_key(37, "orders"), 5)[:-1] == [
            "tarry.delay-level-05",
            "tarry.delay-level-02",
            "tarry.delay-level-00",
        ]
        # And a delay past the maximum is refused before anything is published
        with pytest.raises(InvalidArgument):
            await sender.send("orders", aio_pika.Message(b"x"), delay_ms=(MAX + 1) * 1000)
    finally:
        await link.close()


@pytest.mark.slow
async def test_five_seconds_travels_through_levels_2_and_0_to_a_plain_pika_consumer(
    broker: Broker,
) -> None:
    # Given NServiceBus's v2 topology declared by plain pika code written from the reference
    # (knowing nothing of tarry), and an endpoint queue bound the NServiceBus way
    with broker.blocking() as connection:
        channel = connection.channel()
        for level in range(27, -1, -1):
            name = f"nsb.v2.delay-level-{level:02d}"
            channel.exchange_declare(name, "topic", durable=True)
            channel.queue_declare(
                name,
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                    "x-message-ttl": (2**level) * 1000,
                    "x-dead-letter-exchange": (
                        f"nsb.v2.delay-level-{level - 1:02d}" if level else "nsb.v2.delay-delivery"
                    ),
                },
            )
            channel.queue_bind(name, name, routing_key="*." * (27 - level) + "1.#")
        for level in range(27, 0, -1):
            channel.exchange_bind(
                destination=f"nsb.v2.delay-level-{level - 1:02d}",
                source=f"nsb.v2.delay-level-{level:02d}",
                routing_key="*." * (27 - level) + "0.#",
            )
        channel.exchange_declare("nsb.v2.delay-delivery", "topic", durable=True)
        channel.exchange_bind(
            destination="nsb.v2.delay-delivery",
            source="nsb.v2.delay-level-00",
            routing_key="*." * 27 + "0.#",
        )
        channel.queue_declare("Billing", durable=True)
        channel.queue_bind("Billing", "nsb.v2.delay-delivery", routing_key="#.Billing")

    # When tarry declares its topology with --prefix nsb.v2 (must be equivalent: no
    # precondition failure) and sends with a 5 s delay
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, Topology(prefix="nsb.v2"), queue_type=QueueType.QUORUM)
    message = aio_pika.Message(
        b'{"invoice": 7}',
        headers={"NServiceBus.MessageId": "m-7", "tenant": "acme"},
        content_type="application/json",
        message_id="m-7",
        correlation_id="c-7",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    started = time.monotonic()
    try:
        exchange, key = await sender.send("Billing", message, delay_ms=4_500)
    finally:
        await link.close()
    assert exchange == "nsb.v2.delay-level-02"
    assert key == "0." * 25 + "1.0.1.Billing"

    # Then the plain pika consumer receives it from its own queue, not before 5 s, intact
    method, properties, body = broker.get("Billing", timeout_s=12)
    waited = time.monotonic() - started
    assert waited >= 5.0
    assert body == b'{"invoice": 7}'
    assert properties.content_type == "application/json"
    assert properties.message_id == "m-7" and properties.correlation_id == "c-7"
    assert properties.delivery_mode == 2
    assert properties.headers["tenant"] == "acme"
    assert properties.headers[DELAY_HEADER] == 5
    assert method.routing_key == key
    # and RabbitMQ's own record shows the path: level 2's queue, then level 0's
    assert [d["queue"] for d in properties.headers["x-death"]] == [
        "nsb.v2.delay-level-00",
        "nsb.v2.delay-level-02",
    ]


async def test_declare_is_idempotent_and_refuses_the_other_queue_type(broker: Broker) -> None:
    link = AmqpLink(broker.url)
    topology = Topology(prefix="t", levels=4)
    try:
        await declare_topology(await link.channel(), topology, QueueType.CLASSIC)
        await declare_topology(await link.channel(), topology, QueueType.CLASSIC)
        with pytest.raises(PreconditionFailed, match="other arguments"):
            await declare_topology(await link.channel(), topology, QueueType.QUORUM)
    finally:
        await link.close()
    with broker.blocking() as connection:
        declared = connection.channel().queue_declare(
            "t.delay-level-03",
            durable=True,
            passive=True,
        )
        assert declared.method.queue == "t.delay-level-03"


async def test_a_classic_topology_with_few_levels_delivers_a_one_second_delay(
    broker: Broker,
) -> None:
    topology = Topology(prefix="c", levels=3)
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, topology, queue_type=QueueType.CLASSIC)
    declare_endpoint(broker, "inbox")
    try:
        await sender.send("inbox", aio_pika.Message(b"soon"), delay_ms=1)
        with pytest.raises(InvalidArgument, match="maximum of 7 s"):
            await sender.send("inbox", aio_pika.Message(b"late"), delay_ms=8_000)
    finally:
        await link.close()
    started = time.monotonic()
    _, properties, body = broker.get("inbox", timeout_s=5)
    assert body == b"soon" and properties.headers[DELAY_HEADER] == 1
    assert time.monotonic() - started < 3


async def test_sending_for_a_queue_rabbitmq_does_not_have_is_unknown_destination(
    broker: Broker,
) -> None:
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, Topology(prefix="u", levels=2), queue_type=QueueType.CLASSIC)
    try:
        with pytest.raises(UnknownDestination, match="no queue named 'ghost'"):
            await sender.send("ghost", aio_pika.Message(b"x"), delay_ms=1000)
        # the link survives the refused bind and keeps working
        declare_endpoint(broker, "real")
        await sender.send("real", aio_pika.Message(b"y"), delay_ms=0)
    finally:
        await link.close()
    assert broker.get("real")[2] == b"y"
