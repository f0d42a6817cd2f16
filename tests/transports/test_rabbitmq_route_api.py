"""A RabbitMQ route put at run time (``PUT /v1/routes/{name}``) on a real ``tarry serve``
publishes due messages to a real RabbitMQ, and is replaced and deleted without a restart."""

from __future__ import annotations

import pytest

from tarry import Client
from tests.e2e.receiver import wait_until
from tests.transports.conftest import Broker

pytestmark = pytest.mark.rabbitmq


def test_a_rabbitmq_route_put_at_run_time_publishes_and_can_be_redirected(
    make_server, broker: Broker
) -> None:
    # Given two queues in the test's own virtual host, and a server without routes
    with broker.blocking() as connection:
        channel = connection.channel()
        channel.queue_declare("first", durable=True)
        channel.queue_declare("second", durable=True)
    server = make_server()
    with Client(server.url) as client:
        # When a RabbitMQ route is put and a message sent to it
        client.put_route("rmq", transport="rabbitmq", url=broker.url, routing_key="first")
        sent = client.send("rmq", "to first", delay="100ms")
        # Then it is published into RabbitMQ with its id
        _, properties, body = broker.get("first", timeout_s=10)
        assert body == b"to first" and properties.message_id == sent.id
        wait_until(lambda: client.get(sent.id).state == "delivered")
        # When the route is replaced to route elsewhere, the next message goes there
        client.put_route("rmq", transport="rabbitmq", url=broker.url, routing_key="second")
        client.send("rmq", "to second")
        _, _, body = broker.get("second", timeout_s=10)
        assert body == b"to second" and broker.count("first") == 0
        # And once nothing waits for it, it is deleted
        wait_until(lambda: client.list(destination="rmq", state="scheduled").items == [])
        assert client.delete_route("rmq")["deleted"] is True
