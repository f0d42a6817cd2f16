"""RabbitMQ as a destination of tarry's own store (route ``transport = "rabbitmq"``): publish on
due with confirms, remaining TTL in ``expiration``, properties kept; while RabbitMQ is away or
blocks publishers the breaker opens, nothing is lost, and delivery resumes by itself."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time

import pytest

from tarry.model.state import MessageState
from tests.transports.conftest import Broker

pytestmark = pytest.mark.rabbitmq


class Proxy:
    """A TCP relay to the real RabbitMQ that the test can cut and restore: to tarry, RabbitMQ
    is down while it is cut (other users of the broker are not disturbed)."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._open = False

    async def start(self) -> None:
        self._open = True
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        self._open = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if not self._open:  # accepted just as the relay was cut
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 5672)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        if not self._open:
            writer.close()
            up_writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


@pytest.fixture
async def proxy():
    relay = Proxy()
    await relay.start()
    yield relay
    await relay.cut()


def route(url: str, **extra: object) -> dict:
    return {"transport": "rabbitmq", "url": url, "routing_key": "out", "timeout_ms": 500, **extra}


def declare_out(broker: Broker) -> None:
    with broker.blocking() as connection:
        connection.channel().queue_declare("out", durable=True)


def take(broker: Broker, timeout_s: float = 5.0):
    return broker.get("out", timeout_s)[1:]


async def wait_state(engine, message_id: str, state: MessageState, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (await engine.get_message(message_id)).state is not state:
        assert time.monotonic() < deadline, f"{message_id} never became {state}"
        await asyncio.sleep(0.05)


async def test_a_due_message_is_published_with_its_properties_and_its_remaining_ttl(
    broker: Broker, make_engine
) -> None:
    # Given a route to RabbitMQ's default exchange, key "out"
    declare_out(broker)
    engine = await make_engine({"routes": {"bus": route(broker.url)}})
    # When a message with a 1 s delay and a 60 s TTL falls due
    sent = await engine.send(
        {
            "destination": "bus",
            "body": '{"n": 1}',
            "delay_ms": 1000,
            "ttl_ms": 60_000,
            "message_id": "order-1",
            "correlation_id": "corr-1",
            "headers": {"tenant": "acme", "content-type": "application/json"},
        }
    )
    await wait_state(engine, sent.id, MessageState.DELIVERED, 5)
    properties, body = await asyncio.to_thread(take, broker)
    # Then RabbitMQ has it, intact, with the time left before expires_at as its expiration
    assert body == b'{"n": 1}'
    assert properties.message_id == "order-1" and properties.correlation_id == "corr-1"
    assert properties.content_type == "application/json"
    assert properties.headers["tenant"] == "acme"
    assert properties.headers["tarry-id"] == sent.id
    assert properties.delivery_mode == 2
    assert 57_000 <= int(properties.expiration) <= 59_000  # 60 s minus the ~1 s it waited


async def test_an_unroutable_message_is_not_lost_it_goes_to_the_error_queue(
    broker: Broker, make_engine
) -> None:
    # Given a route whose routing key no queue is bound to
    engine = await make_engine(
        {"routes": {"bus": route(broker.url)}, "dispatch": {"number_of_retries": 0}}
    )
    sent = await engine.send({"destination": "bus", "body": "lost?"})
    # Then RabbitMQ's return refuses it and tarry dead-letters it, with the reason
    await wait_state(engine, sent.id, MessageState.DEAD_LETTERED, 5)
    (dead,) = await engine.receive("tarry.error", max_messages=1)
    assert "unroutable" in dead.message.headers["tarry-failure"]


async def test_while_rabbitmq_is_down_messages_wait_and_then_go_out_by_themselves(
    broker: Broker, make_engine, proxy: Proxy
) -> None:
    # Given a route to RabbitMQ through a relay the test can cut
    declare_out(broker)
    url = broker.url.replace(":5672/", f":{proxy.port}/")
    # lease_ms, max_sleep_ms: should an attempt never return (seen rarely after a cut mid-
    # handshake), its claim lapses and the next look tries the message again
    engine = await make_engine(
        {"routes": {"bus": route(url)}, "dispatch": {"lease_ms": 5000, "max_sleep_ms": 1000}}
    )
    warm_up = await engine.send({"destination": "bus", "body": "warm-up"})
    await asyncio.to_thread(take, broker)
    # (confirmed to tarry too: a confirm cut off on its way would be published again)
    await wait_state(engine, warm_up.id, MessageState.DELIVERED, 5)
    # When RabbitMQ goes away and messages fall due
    await proxy.cut()
    ids = [(await engine.send({"destination": "bus", "body": f"m{i}"})).id for i in range(5)]
    await asyncio.sleep(1.5)
    # Then they wait in the store, no attempt is counted, nothing went to the error queue
    for message_id in ids:
        message = await engine.get_message(message_id)
        assert message.state is MessageState.SCHEDULED and message.failures == 0
    assert engine.breakers.dispatch.state.value == "armed"
    assert (await engine.queue_info("tarry.error")).ready == 0
    # When RabbitMQ is back, they are delivered without anyone's help
    await proxy.start()
    for message_id in ids:
        await wait_state(engine, message_id, MessageState.DELIVERED, 20)
    bodies = {(await asyncio.to_thread(take, broker))[1] for _ in ids}
    assert bodies == {f"m{i}".encode() for i in range(5)}
    assert engine.health()["status"] == "ok"


def wait_for_alarm(*, raised: bool, timeout_s: float = 10.0) -> None:
    """RabbitMQ's memory monitor acts on its own schedule: wait until it says so."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = subprocess.run(
            ["rabbitmqctl", "-q", "status"], capture_output=True, text=True, timeout=30
        ).stdout
        alarms = status.split("Alarms", 1)[1].split("\n\n", 2)[1] if "Alarms" in status else ""
        if ("Memory alarm" in alarms or "memory" in alarms.lower()) == raised:
            return
        assert time.monotonic() < deadline, f"RabbitMQ's memory alarm never became {raised}"
        time.sleep(0.2)


@pytest.mark.slow
async def test_while_rabbitmq_blocks_publishers_the_dispatch_breaker_opens_and_recovers(
    broker: Broker, make_engine
) -> None:
    # Given a route to the real RabbitMQ
    declare_out(broker)
    engine = await make_engine(
        {
            "routes": {"bus": route(broker.url, timeout_ms=1000)},
            # Off: a publish blocked for its 1 s timeout also puts releases behind, and on a
            # loaded machine "overload" could open first; this test is about the breaker.
            "dispatch": {"time_to_trigger_dispatch_ms": 300, "overload_lag_ms": 0},
        }
    )
    warm_up = await engine.send({"destination": "bus", "body": "warm-up"})
    await asyncio.to_thread(take, broker)
    await wait_state(engine, warm_up.id, MessageState.DELIVERED, 5)
    # When RabbitMQ raises a memory alarm (it blocks every publisher), briefly
    alarm = ["rabbitmqctl", "-q", "set_vm_memory_high_watermark"]
    subprocess.run([*alarm, "0"], check=True, capture_output=True, timeout=30)
    try:
        wait_for_alarm(raised=True)
        sent = await engine.send({"destination": "bus", "body": "blocked"})
        deadline = time.monotonic() + 5
        while engine.health()["status"] != "degraded":
            assert time.monotonic() < deadline, "the dispatch breaker never opened"
            await asyncio.sleep(0.1)
        # Then the breaker is open and the message waits in tarry's store
        assert engine.health()["open"] == ["dispatch"]
        message = await engine.get_message(sent.id)
        assert message.state is MessageState.SCHEDULED and message.failures == 0
    finally:
        subprocess.run([*alarm, "0.4"], check=True, capture_output=True, timeout=30)
        wait_for_alarm(raised=False)
    # When the alarm clears, the message goes out by itself and the breaker closes
    await wait_state(engine, sent.id, MessageState.DELIVERED, 20)
    properties, body = await asyncio.to_thread(take, broker)
    assert body == b"blocked" and properties.headers["tarry-id"] == sent.id
    assert engine.health()["status"] == "ok"
    # At-least-once: the publish RabbitMQ caught when it blocked may still go out after the
    # alarm, so a second copy can arrive, with the same tarry-id for consumers to drop.
    await asyncio.sleep(0.5)
    if broker.count("out"):
        properties, body = await asyncio.to_thread(take, broker)
        assert properties.headers["tarry-id"] == sent.id
    assert broker.count("out") == 0
