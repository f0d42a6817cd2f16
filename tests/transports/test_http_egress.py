"""The route guard at connection time (``tarry.transports.egress``): every connection resolves the
host, checks each address, and connects to a checked address, so a name that resolves (or
re-resolves, DNS rebinding) to a refused address never receives a delivery. A real receiver
on loopback stands for the internal service; the resolver is replaced to play the attacker's
DNS."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from tarry.config import RouteConfig
from tarry.errors import DeliveryFailed, ForbiddenAddress
from tarry.model.egress import EgressPolicy
from tarry.model.message import Message
from tarry.transports.build import build_transport
from tarry.transports.http import HttpTransport
from tests.e2e.receiver import receiver as receiver  # the internal service (a fixture)


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names this test's resolver answers, with the addresses it gives; lookups counted."""
    answers: dict[str, list[str]] = {}
    real = asyncio.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: Any, host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            family = {True: socket.AF_INET6, False: socket.AF_INET}
            return [
                (family[":" in a], socket.SOCK_STREAM, 6, "", (a, int(port))) for a in answers[host]
            ]
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    return answers


def message() -> Message:
    return Message(
        id="m1",
        destination="billing.hook",
        body=b"hello",
        headers={},
        sent_at_ms=0,
        deliver_at_ms=0,
        expires_at_ms=None,
    )


def transport(url: str, policy: EgressPolicy) -> HttpTransport:
    route = RouteConfig(transport="http", url=url, timeout_ms=2_000)
    return HttpTransport(route, egress=policy)


async def test_a_name_that_resolves_to_loopback_is_refused_at_delivery_for_good(
    receiver, dns
) -> None:
    # Given a route to a public-looking name, which the put could not refuse
    dns["hooks.attacker.example"] = ["127.0.0.1"]
    http = transport(f"http://hooks.attacker.example:{receiver.port}/hook", EgressPolicy())
    # When a message is delivered, the name resolves to this machine
    with pytest.raises(DeliveryFailed) as failed:
        await http.deliver(message())
    await http.close()
    # Then nothing reaches the internal service, and the failure is permanent, saying why
    assert receiver.attempts == []
    assert failed.value.reason == "forbidden_address"
    assert failed.value.details["permanent"]
    assert "hooks.attacker.example (127.0.0.1) is a loopback address" in failed.value.message


async def test_one_refused_address_among_public_ones_refuses_the_name(receiver, dns) -> None:
    dns["mixed.example"] = ["93.184.215.14", "169.254.169.254"]
    http = transport("http://mixed.example/hook", EgressPolicy())
    with pytest.raises(DeliveryFailed, match="link-local"):
        await http.deliver(message())
    await http.close()


async def test_an_allowed_network_is_reached_at_the_checked_address_under_its_name(
    receiver, dns
) -> None:
    # Given the operator allows 127.0.0.0/8, and a name that resolves there
    dns["hooks.internal"] = ["127.0.0.1"]
    policy = EgressPolicy.from_entries(["127.0.0.0/8"])
    http = transport(f"http://hooks.internal:{receiver.port}/hook", policy)
    # When a message is delivered twice
    await http.deliver(message())
    await http.deliver(message())
    await http.close()
    # Then it arrives, addressed to the route's host name (the connection went to the address)
    assert [a.body for a in receiver.accepted] == [b"hello", b"hello"]
    assert receiver.accepted[0].headers["host"] == f"hooks.internal:{receiver.port}"


async def test_a_redirect_is_not_followed(receiver, dns) -> None:
    # Given an allowed receiver that answers with a redirect (to anywhere)
    receiver.statuses = [302]
    dns["hooks.internal"] = ["127.0.0.1"]
    policy = EgressPolicy.from_entries(["hooks.internal"])
    http = transport(f"http://hooks.internal:{receiver.port}/hook", policy)
    # Then the delivery fails for good, one request made
    with pytest.raises(DeliveryFailed) as failed:
        await http.deliver(message())
    await http.close()
    assert failed.value.reason == "http_302" and failed.value.details["permanent"]
    assert len(receiver.attempts) == 1


def test_building_a_route_to_a_literal_internal_address_is_refused() -> None:
    route = RouteConfig(transport="http", url="http://169.254.169.254/latest/meta-data/")
    with pytest.raises(ForbiddenAddress, match=r"\[egress\] allow"):
        build_transport("billing.hook", route, egress=EgressPolicy())
    # The operator's own routes (tarry.toml) are built without the guard
    assert isinstance(build_transport("billing.hook", route), HttpTransport)


async def test_a_put_resolves_the_name_and_refuses_an_internal_answer(dns) -> None:
    dns["inside.example"] = ["10.1.2.3"]
    dns["outside.example"] = ["93.184.215.14"]
    made = [
        transport(f"https://{name}/hook", EgressPolicy())
        for name in ("inside.example", "outside.example", "nowhere.invalid")
    ]
    with pytest.raises(ForbiddenAddress, match=r"inside.example \(10.1.2.3\) is a private"):
        await made[0].check_address()
    # A public answer passes, and so does a name that does not resolve yet (each connection
    # checks it again)
    await made[1].check_address()
    await made[2].check_address()
    for http in made:
        await http.close()
