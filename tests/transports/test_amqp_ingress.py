"""Scheduling from any AMQP client: plain pika publishes to ``tarry.schedule``; tarry validates
with the HTTP API's rules, stores, and only then acks; a rule breaker goes to the dead-letter
exchange with its error code; while the store cannot write, nothing is acked."""

from __future__ import annotations

import asyncio
import time

import pika
import pytest

from tarry.errors import InvalidArgument, Overloaded
from tarry.model.state import MessageState
from tarry.model.validate import parse_send
from tarry.transports.amqp_ingress import send_fields
from tests.transports.conftest import Broker

# --- headers → send fields (pure) --------------------------------------------------------------


def test_headers_name_the_destination_and_the_delay_in_any_accepted_form() -> None:
    assert send_fields(b"b", {"tarry-destination": "q", "x-delay": 1500}) == {
        "body": b"b",
        "destination": "q",
        "delay_ms": 1500,
    }
    assert send_fields(b"", {"tarry-destination": "q", "tarry-delay": "5s"})["delay_ms"] == 5000
    assert send_fields(b"", {"tarry-destination": "q", "tarry-delay": b"250"})["delay_ms"] == 250
    fields = send_fields(
        b"",
        {"tarry-destination": "q", "tarry-deliver-at": "2027-03-01T09:00:00Z", "n": 7},
        message_id="m",
        correlation_id="c",
        content_type="application/json",
    )
    assert fields["deliver_at"] == "2027-03-01T09:00:00Z"
    assert fields["headers"] == {"n": "7", "content-type": "application/json"}
    assert fields["message_id"] == "m" and fields["correlation_id"] == "c"


def test_unreadable_control_headers_are_invalid_arguments() -> None:
    with pytest.raises(InvalidArgument, match="tarry-destination is required"):
        send_fields(b"", {"x-delay": 5})
    with pytest.raises(InvalidArgument, match="must not be negative"):
        send_fields(b"", {"tarry-destination": "q", "x-delay": -5})
    with pytest.raises(InvalidArgument, match="repeats delay_ms"):
        send_fields(b"", {"tarry-destination": "q", "x-delay": 5, "tarry-delay": "5s"})
    with pytest.raises(InvalidArgument, match="duration"):
        send_fields(b"", {"tarry-destination": "q", "tarry-ttl": "soon"})


@pytest.mark.parametrize(
    "headers",
    [
        {"tarry-delay": "²"},
        {"tarry-delay": "-²"},
        {"x-delay": "١٢"},
        {"tarry-ttl": "9" * 5000},
        {"tarry-deliver-at": "²"},
    ],
)
def test_finding_05_a_control_header_of_non_ascii_or_endless_digits_is_invalid_argument(
    headers: dict[str, str],
) -> None:
    # str.isdigit() passed these and int() raised ValueError (or read "١٢" as 12)
    try:
        fields = send_fields(b"", {"tarry-destination": "q", **headers})
    except InvalidArgument:
        return
    # a time is left as text for parse_send, which refuses it
    assert fields["deliver_at"] == headers["tarry-deliver-at"]
    with pytest.raises(InvalidArgument, match="deliver_at"):
        parse_send(fields)


# --- the ingress on the real broker -------------------------------------------------------------


def publish(broker: Broker, body: bytes, headers: dict, **props: object) -> None:
    with broker.blocking() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            "",
            "tarry.schedule",
            body,
            pika.BasicProperties(headers=headers, delivery_mode=2, **props),
        )


def get_rejected(broker: Broker):
    return broker.get("tarry.schedule.rejected")[1:]


async def ingress_engine(broker: Broker, make_engine, **store: object):
    engine = await make_engine(
        {
            "rabbitmq": {"url": broker.url, "ingress": True},
            "queues": {"orders": {}},
            "store": store,
        }
    )
    await asyncio.wait_for(engine.ingress.ready.wait(), 10)
    return engine


async def find(engine, message_id: str, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        found, _ = await engine.store.list(_query(message_id))
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"{message_id} was never stored"
        await asyncio.sleep(0.05)


def _query(message_id: str):
    from tarry.model.query import MessageQuery

    return MessageQuery(destination="orders", message_id=message_id)


@pytest.mark.rabbitmq
async def test_a_plain_amqp_client_schedules_with_x_delay_and_is_acked_once_stored(
    broker: Broker, make_engine
) -> None:
    engine = await ingress_engine(broker, make_engine)
    assert engine.health()["status"] == "ok"
    # When any AMQP client publishes with the delayed-message plugin's header
    before = engine.clock.now_ms()
    await asyncio.to_thread(
        publish,
        broker,
        b"charge card 42",
        {"tarry-destination": "orders", "x-delay": 2000, "tenant": "acme"},
        message_id="order-42",
        correlation_id="corr-42",
        content_type="text/plain",
    )
    # Then tarry stores it with the same meaning as POST /v1/messages ...
    message = await find(engine, "order-42")
    assert message.state is MessageState.SCHEDULED
    assert before + 2000 <= message.deliver_at_ms <= engine.clock.now_ms() + 2000
    assert message.body == b"charge card 42" and message.correlation_id == "corr-42"
    assert message.headers == {"tenant": "acme", "content-type": "text/plain"}
    # ... and the ingress queue is drained: acked, not left unacked
    deadline = time.monotonic() + 5
    while engine.ingress.stats.accepted < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert broker.count("tarry.schedule") == 0
    # And it is delivered into the queue when due
    (delivery,) = await engine.receive("orders", wait_ms=5000)
    assert delivery.message.id == message.id


@pytest.mark.rabbitmq
async def test_a_message_that_breaks_a_rule_goes_to_the_dead_letter_exchange_with_its_code(
    broker: Broker, make_engine
) -> None:
    engine = await ingress_engine(broker, make_engine)
    # When messages break the rules: unknown destination, a TTL shorter than the delay
    await asyncio.to_thread(
        publish, broker, b"nowhere", {"tarry-destination": "nope"}, message_id="a"
    )
    await asyncio.to_thread(
        publish,
        broker,
        b"too short",
        {"tarry-destination": "orders", "tarry-delay": "10s", "tarry-ttl": "1s"},
        message_id="b",
    )
    # Then each is rejected to the dead-letter exchange, intact, with the error code
    rejected = {}
    for _ in range(2):
        properties, body = await asyncio.to_thread(get_rejected, broker)
        rejected[properties.message_id] = (properties.headers, body)
    assert rejected["a"][0]["tarry-error-code"] == "unknown_destination"
    assert rejected["a"][1] == b"nowhere"
    assert rejected["b"][0]["tarry-error-code"] == "expiry_error"
    assert "raise ttl_ms" in rejected["b"][0]["tarry-error-message"]
    assert rejected["b"][0]["tarry-delay"] == "10s"
    # and nothing of them was stored, and nothing is left in the ingress queue
    assert engine.ingress.stats.rejected == 2
    assert (await engine.store.list(_query("b")))[0] == []
    assert broker.count("tarry.schedule") == 0


@pytest.mark.rabbitmq
async def test_nothing_is_acked_while_the_store_cannot_write(broker: Broker, make_engine) -> None:
    # (the SQLite store: its file can be capped to make it refuse writes)
    engine = await ingress_engine(broker, make_engine, engine="sqlite")
    pages = await engine.store.read(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    # Given a store that cannot grow
    await engine.store.read(
        lambda c: engine.store.db._require().execute(f"PRAGMA max_page_count={pages}")
    )
    # When a message arrives that needs room
    big = b"x" * 200_000
    await asyncio.to_thread(publish, broker, big, {"tarry-destination": "orders"}, message_id="big")
    deadline = time.monotonic() + 5
    while engine.ingress.stats.requeued < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    # Then it is neither acked nor rejected: RabbitMQ still has it
    assert engine.ingress.stats.accepted == 0 and engine.ingress.stats.rejected == 0
    assert (await engine.store.list(_query("big")))[0] == []
    # When the store has room again, the redelivered message is stored and acked
    await engine.store.read(
        lambda c: engine.store.db._require().execute("PRAGMA max_page_count=1000000")
    )
    message = await find(engine, "big", timeout_s=10)
    assert message.body == big
    deadline = time.monotonic() + 5
    while broker.count("tarry.schedule"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@pytest.mark.rabbitmq
async def test_a_backlog_larger_than_the_servers_batch_limit_is_judged_message_by_message(
    broker: Broker, make_engine
) -> None:
    # Given a backlog waiting in tarry.schedule before tarry starts, and a tiny max_batch
    with broker.blocking() as connection:
        connection.channel().queue_declare(
            "tarry.schedule", durable=True, arguments={"x-queue-type": "quorum"}
        )
    for i in range(6):
        headers = {"tarry-destination": "orders" if i != 3 else "nope"}
        await asyncio.to_thread(publish, broker, b"b", headers, message_id=f"k{i}")
    engine = await make_engine(
        {
            "rabbitmq": {"url": broker.url, "ingress": True},
            "queues": {"orders": {}},
            "server": {"max_batch": 2},
        }
    )
    # Then every valid one is stored and only the bad one is rejected
    for i in (0, 1, 2, 4, 5):
        await find(engine, f"k{i}")
    properties, _ = await asyncio.to_thread(get_rejected, broker)
    assert properties.message_id == "k3"
    assert properties.headers["tarry-error-code"] == "unknown_destination"


async def test_an_ingress_that_cannot_reach_rabbitmq_shows_in_health_and_keeps_trying(
    make_engine,
) -> None:
    engine = await make_engine(
        {"rabbitmq": {"url": "amqp://guest:guest@127.0.0.1:1/", "ingress": True}}
    )
    await asyncio.sleep(0.2)
    health = engine.health()
    assert health["status"] == "degraded" and health["open"] == ["ingress"]
    assert not engine.ingress.ready.is_set()


@pytest.mark.rabbitmq
async def test_while_releases_are_behind_the_ingress_requeues_and_stores_once_caught_up(
    broker: Broker, make_engine
) -> None:
    # Given a server far behind on releases: thousands due at once, released five a round, each
    # round a queue-database transaction (into the queues kept in memory it catches up at once)
    engine = await make_engine(
        {
            "rabbitmq": {"url": broker.url, "ingress": True},
            "queues": {"orders": {}},
            "dispatch": {"batch_size": 5, "overload_lag_ms": 100},
            "store": {"queues_in_memory": False},
        }
    )
    await asyncio.wait_for(engine.ingress.ready.wait(), 10)
    due_at = engine.clock.now_ms() + 2_000
    for batch in range(4):
        results = await engine.send_batch(
            [{"destination": "orders", "body": "b", "deliver_at": due_at} for _ in range(2_000)]
        )
        refused = [r for r in results if isinstance(r, Exception)]
        if refused and batch:  # a slow machine sent past due_at: behind already, as wanted
            assert all(isinstance(r, Overloaded) for r in refused)
            break
        assert not refused
    deadline = time.monotonic() + 20
    while engine.dispatcher.lag.lag_ms() <= 100:
        assert time.monotonic() < deadline, "the engine never fell behind"
        await asyncio.sleep(0.01)
    # When an AMQP client publishes meanwhile
    await asyncio.to_thread(
        publish, broker, b"late", {"tarry-destination": "orders"}, message_id="while-behind"
    )
    # Then it is returned to tarry.schedule (not stored, not rejected) while refused ...
    deadline = time.monotonic() + 20  # its own: falling behind may have taken most of the first
    while engine.ingress.stats.requeued < 1:
        assert time.monotonic() < deadline, "the ingress never requeued"
        await asyncio.sleep(0.01)
    assert engine.ingress.stats.rejected == 0
    # ... and stored once the server caught up
    found = await find(engine, "while-behind", timeout_s=60)
    assert found.body == b"late"


@pytest.mark.rabbitmq
async def test_a_scoped_ingress_rejects_another_tenants_destination_with_not_authorized(
    broker: Broker, make_engine
) -> None:
    # Given a token server whose ingress acts as billing's token
    tokens = [
        {"token": "billing-secret", "name": "billing", "send": ["billing.*"]},
        {"token": "root-secret", "name": "root", "send": ["*"]},
    ]
    engine = await make_engine(
        {
            "auth": {"tokens": tokens},
            "rabbitmq": {"url": broker.url, "ingress": True, "ingress_token": "billing"},
            "queues": {"billing.q": {}, "orders.q": {}},
        }
    )
    await asyncio.wait_for(engine.ingress.ready.wait(), 10)
    # When a producer publishes one message for billing and one for orders
    for destination, message_id in (("orders.q", "theirs"), ("billing.q", "mine")):
        await asyncio.to_thread(
            publish, broker, b"x", {"tarry-destination": destination}, message_id=message_id
        )
    # Then orders' is rejected to the dead-letter exchange, intact, saying why
    properties, body = await asyncio.to_thread(get_rejected, broker)
    assert properties.message_id == "theirs" and body == b"x"
    assert properties.headers["tarry-error-code"] == "not_authorized"
    assert "'orders.q'" in properties.headers["tarry-error-message"]
    # And billing's is stored; nothing reached orders.q, nothing is left in the ingress queue
    deadline = time.monotonic() + 5
    while engine.ingress.stats.accepted < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert engine.ingress.stats.rejected == 1
    (delivery,) = await engine.receive("billing.q", wait_ms=5000)
    assert delivery.message.message_id == "mine"
    assert await engine.receive("orders.q", wait_ms=0) == []
    assert broker.count("tarry.schedule") == 0
