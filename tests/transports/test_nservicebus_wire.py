"""tarry's native delay topology on the wire, bit for bit as NServiceBus.RabbitMQ (7.0+) puts it
there, AMQP field types included: the real broker's own record of the queue arguments
(``rabbitmqctl eval``), and messages read back as raw frames (pika and aio-pika decode the
field types away, and NServiceBus's .NET tools throw on the wrong one).

What NServiceBus does, from its source (``DelayInfrastructure.cs``,
``BasicPropertiesExtensions.cs``, ``ConventionalRoutingTopology.cs``, ``DelayCommandHelpers.cs``):
level queues carry ``x-message-ttl`` as ``Convert.ToInt64(...)`` (AMQP ``l``); a delayed message
carries ``NServiceBus.Transport.RabbitMQ.DelayInSeconds`` as ``Convert.ToInt32(delay)`` (``I``,
unboxed by its tools with ``(int)``), negative for a due time in the past, and
``NServiceBus.TimeSent`` as a string (``S``) in ``yyyy-MM-dd HH:mm:ss:ffffff Z``, without which its
tools move the message to a poison queue; ``content_type`` is always set; the conventional
routing topology binds the endpoint's exchange to the delivery exchange.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aio_pika
import pytest
from pamqp import commands, decode
from pamqp import frame as amqp_frame

from tarry import Client
from tarry.errors import UnknownDestination
from tarry.model import topology as model_topology
from tarry.model.topology import QueueType, Topology
from tarry.transports.rabbitmq import AmqpLink
from tarry.transports.rabbitmq_topology import NativeDelaySender, declare_topology
from tests.transports.conftest import Broker

pytestmark = pytest.mark.rabbitmq

NSB = Topology(prefix="nsb.v2")
#: NServiceBus's header names, written out here rather than imported from tarry.
DELAY_HEADER = "NServiceBus.Transport.RabbitMQ.DelayInSeconds"
TIME_SENT_HEADER = "NServiceBus.TimeSent"
#: .NET's ``DateTimeOffset.ParseExact(value, "yyyy-MM-dd HH:mm:ss:ffffff Z", …)``, as a pattern.
NSB_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{6} Z$")


# --- the broker's record of queue arguments, with their types -----------------------------------
def queue_arguments(vhost: str) -> dict[str, dict[str, tuple[str, str]]]:
    """queue → argument → (RabbitMQ's type name, value as Erlang prints it), from the broker's
    own queue records: ``long`` is AMQP ``l``, ``signedint`` ``I``, ``short`` ``s``."""
    script = (
        '[io:format("~s\\t~s\\t~s\\t~p~n", [N, K, T, V]) || '
        f'I <- rabbit_amqqueue:info_all(<<"{vhost}">>, [name, arguments]), '
        "{resource, _, queue, N} <- [proplists:get_value(name, I)], "
        "{K, T, V} <- proplists:get_value(arguments, I)], ok."
    )
    out = subprocess.run(
        ["rabbitmqctl", "-q", "eval", script],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for line in out.splitlines():
        if line.count("\t") == 3:
            queue, key, kind, value = line.split("\t")
            found.setdefault(queue, {})[key] = (kind, value.removeprefix('<<"').removesuffix('">>'))
    return found


def bindings(vhost: str) -> set[tuple[str, str, str, str, str]]:
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_bindings", "-p", vhost, "source_name", "source_kind"]
        + ["destination_name", "destination_kind", "routing_key"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return {tuple(line.split("\t")) for line in out.splitlines()[1:]}  # type: ignore[misc]


# --- just enough AMQP 0-9-1 over a socket to read a message's header table as sent -------------
@dataclass
class RawMessage:
    routing_key: str | None
    exchange: str | None
    content_type: str | None
    #: header → (AMQP type tag, value)
    headers: dict[str, tuple[str, Any]]
    body: bytes


class RawAmqp:
    """A socket speaking AMQP 0-9-1 through pamqp's frame codec, keeping the content header's
    bytes so the field-table type tags stay visible."""

    def __init__(self, vhost: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", 5672), timeout=10)
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        self.send(commands.Connection.StartOk(response="\0guest\0guest"), channel=0)
        tune = self.expect(commands.Connection.Tune)
        self.send(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
            channel=0,
        )
        self.send(commands.Connection.Open(virtual_host=vhost), channel=0)
        self.expect(commands.Connection.OpenOk)
        self.send(commands.Channel.Open(), channel=1)
        self.expect(commands.Channel.OpenOk)

    def send(self, method: Any, *, channel: int = 1) -> None:
        self.sock.sendall(amqp_frame.marshal(method, channel))

    def read_frame(self) -> tuple[int, bytes]:
        """(frame type, payload) of the next frame."""
        head = self._read(7)
        kind, _channel, size = struct.unpack(">BHI", head)
        payload = self._read(size)
        assert self._read(1) == b"\xce", "frame end"
        return kind, payload

    def expect(self, method_class: type) -> Any:
        kind, payload = self.read_frame()
        _, _, method = amqp_frame.unmarshal(
            struct.pack(">BHI", kind, 0, len(payload)) + payload + b"\xce"
        )
        assert isinstance(method, method_class), f"expected {method_class}, got {method}"
        return method

    def get(self, queue: str, timeout_s: float = 5.0) -> RawMessage:
        deadline = time.monotonic() + timeout_s
        while True:
            self.send(commands.Basic.Get(queue=queue, no_ack=True))
            kind, payload = self.read_frame()
            method = amqp_frame.unmarshal(
                struct.pack(">BHI", kind, 1, len(payload)) + payload + b"\xce"
            )[2]
            if isinstance(method, commands.Basic.GetOk):
                break
            assert isinstance(method, commands.Basic.GetEmpty)
            assert time.monotonic() < deadline, f"nothing arrived in {queue}"
            time.sleep(0.05)
        kind, header = self.read_frame()
        assert kind == 2, "content header frame"
        body_size, content_type, headers = parse_content_header(header)
        body = b""
        while len(body) < body_size:
            kind, chunk = self.read_frame()
            assert kind == 3, "content body frame"
            body += chunk
        return RawMessage(method.routing_key, method.exchange, content_type, headers, body)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def parse_content_header(payload: bytes) -> tuple[int, str | None, dict[str, tuple[str, Any]]]:
    """(body size, content_type, headers with type tags) from a content header frame's payload:
    class, weight, body size, property flags, then content-type, content-encoding, headers."""
    _class, _weight, body_size, flags = struct.unpack_from(">HHQH", payload)
    offset = 14
    content_type = None
    if flags & 0x8000:
        used, content_type = decode.short_str(payload[offset:])
        offset += used
    if flags & 0x4000:
        used, _ = decode.short_str(payload[offset:])
        offset += used
    headers: dict[str, tuple[str, Any]] = {}
    if flags & 0x2000:
        (length,) = struct.unpack_from(">I", payload, offset)
        offset += 4
        end = offset + length
        while offset < end:
            used, key = decode.short_str(payload[offset:])
            offset += used
            tag = chr(payload[offset])
            used, value = decode.embedded_value(payload[offset:])
            offset += used
            headers[key] = (tag, value)
    return body_size, content_type, headers


def declare_endpoint(broker: Broker, queue: str, *, conventional: bool = False) -> None:
    """An endpoint's queue; ``conventional``: also its fanout exchange of the same name, bound
    to the queue, as NServiceBus's ``ConventionalRoutingTopology.Initialize`` declares them."""
    with broker.blocking() as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        if conventional:
            channel.exchange_declare(queue, "fanout", durable=True)
            channel.queue_bind(queue, queue, routing_key="")


# --- the tests -----------------------------------------------------------------------------------
async def test_finding_13_level_queues_declare_x_message_ttl_as_a_64_bit_long(
    broker: Broker,
) -> None:
    # Given tarry declares NServiceBus's v2 topology
    link = AmqpLink(broker.url)
    try:
        await declare_topology(await link.channel(), NSB, QueueType.QUORUM)
    finally:
        await link.close()
    # Then every level queue holds exactly NServiceBus's arguments, in NServiceBus's types:
    # x-message-ttl a long (Convert.ToInt64) at every level, 1 s and 2^27 s alike
    declared = queue_arguments(broker.vhost)
    for level in range(28):
        assert declared[NSB.level_name(level)] == {
            "x-queue-type": ("longstr", "quorum"),
            "x-dead-letter-strategy": ("longstr", "at-least-once"),
            "x-overflow": ("longstr", "reject-publish"),
            "x-message-ttl": ("long", str((1 << level) * 1000)),
            "x-dead-letter-exchange": (
                "longstr",
                NSB.level_name(level - 1) if level else NSB.delivery_exchange,
            ),
        }, f"level {level}"


async def test_finding_13_a_delayed_message_carries_nservicebus_headers_in_their_types(
    broker: Broker,
) -> None:
    # Given the topology and an endpoint queue
    declare_endpoint(broker, "Billing")
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, NSB, queue_type=QueueType.QUORUM)
    raw = RawAmqp(broker.vhost)
    try:
        # When tarry sends one message for now, and one that will wait 3 s
        before = datetime.now(UTC)
        await sender.send("Billing", aio_pika.Message(b"now", message_id="m-1"), delay_ms=0)
        await sender.send("Billing", aio_pika.Message(b"later", message_id="m-2"), delay_ms=2_001)
        after = datetime.now(UTC)
        # Then the message read off the wire has the delay header as a 32-bit int (I), the way
        # NServiceBus's delays tools unbox it, not the smallest type (b/s) that holds it ...
        now = raw.get("Billing")
        assert now.body == b"now"
        assert now.headers[DELAY_HEADER] == ("I", 0)
        # ... TimeSent as a string in NServiceBus's wire format, the moment it was sent (UTC) ...
        tag, sent = now.headers[TIME_SENT_HEADER]
        assert tag == "S" and NSB_TIME.match(sent), sent
        sent_at = datetime.strptime(sent, "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=UTC)
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= sent_at <= after
        # ... and a content type, NServiceBus's default when none is given
        assert now.content_type == "application/octet-stream"
        # And the waiting one sits in level 1 (3 s = 2 + 1), its delay header 3 as an int32
        level_1 = raw.get(NSB.level_name(1))
        assert level_1.body == b"later"
        assert level_1.headers[DELAY_HEADER] == ("I", 3)
        assert level_1.routing_key == NSB.routing_key(3, "Billing")
    finally:
        raw.close()
        await link.close()


async def test_finding_13_a_past_due_time_keeps_its_negative_delay_in_the_header(
    broker: Broker,
) -> None:
    # Given an endpoint queue
    declare_endpoint(broker, "Billing")
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, NSB, queue_type=QueueType.QUORUM)
    raw = RawAmqp(broker.vhost)
    try:
        # When a message is sent whose due time passed 4.5 s ago
        exchange, key = await sender.send("Billing", aio_pika.Message(b"late"), delay_ms=-4_500)
        # Then, as NServiceBus, it goes out at once (key 0, level 0) ...
        assert (exchange, key) == (NSB.level_name(0), "0." * 28 + "Billing")
        got = raw.get("Billing")
        assert got.body == b"late" and got.routing_key == key
        # ... with the negative delay kept in the header (Math.Ceiling(-4.5) = -4), as an int32
        assert got.headers[DELAY_HEADER] == ("I", -4)
    finally:
        raw.close()
        await link.close()


async def test_finding_13_content_type_comes_from_the_message_or_nservicebus_header(
    broker: Broker,
) -> None:
    declare_endpoint(broker, "Billing")
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(link, NSB, queue_type=QueueType.QUORUM)
    raw = RawAmqp(broker.vhost)
    try:
        await sender.send("Billing", aio_pika.Message(b"a", content_type="text/x"), delay_ms=0)
        await sender.send(
            "Billing",
            aio_pika.Message(b"b", headers={"NServiceBus.ContentType": "application/json"}),
            delay_ms=0,
        )
        assert raw.get("Billing").content_type == "text/x"
        second = raw.get("Billing")
        assert second.content_type == "application/json"
        assert second.headers["NServiceBus.ContentType"] == ("S", "application/json")
    finally:
        raw.close()
        await link.close()


async def test_finding_13_conventional_routing_binds_the_endpoint_exchange_to_the_delivery_exchange(
    broker: Broker,
) -> None:
    # Given a conventional NServiceBus endpoint: queue Billing behind a fanout exchange Billing
    declare_endpoint(broker, "Billing", conventional=True)
    link = AmqpLink(broker.url)
    sender = NativeDelaySender(
        link,
        NSB,
        queue_type=QueueType.QUORUM,
        routing_topology=model_topology.RoutingTopology.CONVENTIONAL,
    )
    try:
        # When tarry sends for it with the conventional routing topology
        await sender.send("Billing", aio_pika.Message(b"via exchange"), delay_ms=0)
        # Then the binding is exchange to exchange, exactly NServiceBus's, and no queue binding
        bound = bindings(broker.vhost)
        assert (NSB.delivery_exchange, "exchange", "Billing", "exchange", "#.Billing") in bound
        assert not any(b[0] == NSB.delivery_exchange and b[3] == "queue" for b in bound)
        assert broker.get("Billing")[2] == b"via exchange"
        # And an endpoint without its exchange is an unknown destination that says what to do
        declare_endpoint(broker, "Plain")
        with pytest.raises(UnknownDestination, match="no exchange named 'Plain'"):
            await sender.send("Plain", aio_pika.Message(b"x"), delay_ms=0)
    finally:
        await link.close()


def test_finding_13_a_native_route_sends_the_nservicebus_wire_with_conventional_binding(
    broker: Broker, make_server: Any
) -> None:
    # Given a conventional endpoint and a tarry serve route to it, configured conventional
    declare_endpoint(broker, "Billing", conventional=True)
    server = make_server(
        "[routes.billing]\n"
        'transport = "rabbitmq"\nmode = "native"\n'
        f'url = "{broker.url}"\nrouting_key = "Billing"\nprefix = "nsb.v2"\n'
        'routing_topology = "conventional"\n'
    )
    # When a message is sent through the HTTP API for now
    with Client(server.url) as tarry:
        tarry.send("billing", "invoice 7", message_id="inv-7")
    # Then it arrives through the endpoint's exchange, with NServiceBus's typed headers
    raw = RawAmqp(broker.vhost)
    try:
        got = raw.get("Billing")
    finally:
        raw.close()
    assert got.body == b"invoice 7"
    assert got.headers[DELAY_HEADER][0] == "I" and got.headers[DELAY_HEADER][1] <= 0
    assert NSB_TIME.match(got.headers[TIME_SENT_HEADER][1])
    assert got.content_type == "application/octet-stream"
    assert (NSB.delivery_exchange, "exchange", "Billing", "exchange", "#.Billing") in bindings(
        broker.vhost
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "rabbitmq", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_finding_13_the_cli_refuses_levels_other_than_28_with_prefix_nsb_v2(
    broker: Broker,
) -> None:
    url = ["--url", broker.url, "--prefix", "nsb.v2"]
    # When declare, bind or send is asked for nsb.v2 with 27 levels, it is a usage error ...
    for verb in (["declare"], ["bind", "Billing"], ["send", "Billing", "x", "--delay", "1s"]):
        refused = cli(*verb, *url, "--levels", "27")
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith("invalid_argument:") and "28 levels" in refused.stderr
    # ... found before connecting: nothing was declared
    assert queue_arguments(broker.vhost) == {}
    # And with 28 (the default) the conventional binding works from the command line too
    assert cli("declare", *url).returncode == 0
    declare_endpoint(broker, "Billing", conventional=True)
    bound = cli("bind", "Billing", *url, "--routing-topology", "conventional")
    assert bound.returncode == 0, bound.stderr
    assert json.loads(bound.stdout)["bound"] == "exchange"
    assert (NSB.delivery_exchange, "exchange", "Billing", "exchange", "#.Billing") in bindings(
        broker.vhost
    )
