"""A route in ``mode = "native"``: ``POST /v1/messages`` hands the waiting to RabbitMQ's delay
topology (a real ``tarry serve``, the real broker); tarry keeps a record it cannot cancel."""

from __future__ import annotations

import pika
import pytest

from tarry import Client
from tarry.errors import InvalidArgument, NotCancellable, OptionsError, Unavailable
from tests.transports.conftest import Broker

pytestmark = pytest.mark.rabbitmq


def native_config(broker: Broker) -> str:
    return (
        "[routes.billing]\n"
        'transport = "rabbitmq"\n'
        'mode = "native"\n'
        f'url = "{broker.url}"\n'
        'routing_key = "Billing"\n'
        'prefix = "nsb.v2"\n'
    )


def test_a_send_to_a_native_route_waits_in_rabbitmq_and_cannot_be_cancelled(
    broker: Broker, make_server
) -> None:
    # Given an NServiceBus-style endpoint queue and tarry with a native route to it
    with broker.blocking() as connection:
        connection.channel().queue_declare("Billing", durable=True)
    server = make_server(native_config(broker))
    with Client(server.url) as tarry:
        # When a message is sent with a 5 s delay
        sent = tarry.send("billing", "invoice 7", delay="5s", message_id="inv-7")
        # Then RabbitMQ holds it, in the level 2 queue (5 s = levels 2 and 0), not tarry
        assert sent.state == "delivered"
        assert broker.count("nsb.v2.delay-level-02") == 1
        assert tarry.get(sent.id).state == "delivered"
        # And cancel and reschedule say why they cannot work
        with pytest.raises(NotCancellable, match="RabbitMQ holds it"):
            tarry.cancel(sent.id)
        with pytest.raises(NotCancellable, match="RabbitMQ holds it"):
            tarry.reschedule(sent.id, delay="1s")
        # And a repeated message_id is recorded once and published once
        again = tarry.send("billing", "invoice 7", delay="5s", message_id="inv-7")
        assert again.id == sent.id and again.duplicate
        assert broker.count("nsb.v2.delay-level-02") == 1
        # And the rules of the HTTP API hold: a delay with a TTL cannot be honoured by
        # RabbitMQ's expiration (it would cut the wait short), and the maximum is enforced
        with pytest.raises(OptionsError, match="mode native"):
            tarry.send("billing", "x", delay="5s", ttl="1h")
        with pytest.raises(InvalidArgument, match="maximum"):
            tarry.send("billing", "x", delay=(1 << 28) * 1000)
        # And with no delay it reaches the endpoint's queue at once, through the topology
        now = tarry.send("billing", "now", headers={"k": "v"}, correlation_id="c-1")
    method, properties, body = broker.get("Billing")
    assert body == b"now"
    assert properties.headers["k"] == "v" and properties.headers["tarry-id"] == now.id
    assert properties.correlation_id == "c-1"
    assert method.exchange == "nsb.v2.delay-level-00"  # published there, passed straight on


def test_a_native_route_whose_rabbitmq_is_away_answers_unavailable_and_keeps_nothing(
    make_server,
) -> None:
    server = make_server(
        '[routes.billing]\ntransport = "rabbitmq"\nmode = "native"\n'
        'url = "amqp://guest:guest@127.0.0.1:1/"\ntimeout_ms = 1000\n'
    )
    with Client(server.url) as tarry:
        with pytest.raises(Unavailable, match="nothing was scheduled"):
            tarry.send("billing", "x", delay="5s")
        assert tarry.list(destination="billing").items == []


def test_any_amqp_client_schedules_through_a_running_tarry_serve(
    broker: Broker, make_server
) -> None:
    # Given tarry serve consuming tarry.schedule, with a local queue
    server = make_server(f'[rabbitmq]\nurl = "{broker.url}"\ningress = true\n[queues.orders]\n')
    # When a plain pika client publishes with x-delay
    with broker.blocking() as connection:
        channel = connection.channel()
        channel.queue_declare("tarry.schedule", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        channel.basic_publish(
            "",
            "tarry.schedule",
            b"hello",
            pika.BasicProperties(
                headers={"tarry-destination": "orders", "x-delay": 300}, message_id="p-1"
            ),
        )
    # Then a tarry consumer receives it, once due
    with Client(server.url) as tarry:
        (received,) = tarry.receive("orders", wait="10s")
        assert received.body == b"hello" and received.message_id == "p-1"
        assert received.deliver_at - tarry.get(received.id).raw["sent_at"] == 300
