"""Server-side request forgery through routes, end to end: a token server refuses a route put
through the API to an internal address (403 ``forbidden_address``, saying what to configure),
resolves a name when the route is put and refuses it when it resolves inside, and delivers
where the operator allowed it (``[egress] allow``) or declared the route itself (tarry.toml)."""

from __future__ import annotations

import ipaddress
import socket

import httpx
import pytest

from tests.e2e.receiver import wait_until
from tests.tokens import root_token, tenant_token

ROOT = root_token()


def tenant(url: str, who: str = "billing") -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {who}-secret"})


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/hook",
        "http://localhost:{port}/hook",
        "http://[::1]:{port}/hook",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.1/",
        "http://0.0.0.0:{port}/",
    ],
)
def test_a_token_may_not_put_a_route_to_an_internal_address(make_server, receiver, target) -> None:
    # Given a server with tokens and no [egress] section
    server = make_server(tenant_token("billing") + ROOT)
    url = target.format(port=receiver.port)
    for who in ("billing", "root"):  # the guard is the server's, not a token's
        with tenant(server.url, who) as client:
            # When a route to the internal address is put
            answer = client.put("/v1/routes/billing.hook", json={"transport": "http", "url": url})
            # Then it is refused with the stable code and what to configure, and not stored
            assert answer.status_code == 403, answer.text
            error = answer.json()["error"]
            assert error["code"] == "forbidden_address"
            assert "[egress] allow" in error["message"]
            assert client.get("/v1/routes/billing.hook").status_code == 404
    assert receiver.attempts == []


def test_a_name_that_resolves_to_this_machine_is_refused_when_put(make_server, receiver) -> None:
    host = socket.gethostname()
    try:
        resolved = ipaddress.ip_address(socket.gethostbyname(host))
    except OSError:
        pytest.skip(f"this machine's name {host!r} does not resolve")
    if resolved.is_global:
        pytest.skip(f"this machine's name {host!r} resolves to a public address")
    server = make_server(tenant_token("billing"))
    with tenant(server.url) as billing:
        # When a route is put to a name that resolves to this machine
        route = {"transport": "http", "url": f"http://{host}:{receiver.port}/hook"}
        answer = billing.put("/v1/routes/billing.hook", json=route)
        # Then the put resolves it and refuses it, naming the address it found
        assert answer.status_code == 403, answer.text
        error = answer.json()["error"]
        assert error["code"] == "forbidden_address"
        assert f"{host} ({resolved})" in error["message"]
        assert billing.get("/v1/routes/billing.hook").status_code == 404
    # (a name that resolves elsewhere when put and inside at delivery: test_http_egress.py)
    assert receiver.attempts == []


def test_the_operator_allows_hosts_and_declares_routes_of_its_own(make_server, receiver) -> None:
    # Given a token server whose operator allows 127.0.0.1 and declares a route of its own
    server = make_server(
        tenant_token("billing")
        + '[egress]\nallow = ["127.0.0.1"]\n'
        + '[routes."billing.own"]\ntransport = "http"\n'
        + f'url = "http://localhost:{receiver.port}/own"\n'
    )
    with tenant(server.url) as billing:
        # When the tenant puts a route to the allowed address, and sends to both routes
        route = {"transport": "http", "url": receiver.url}
        assert billing.put("/v1/routes/billing.hook", json=route).status_code == 201
        for destination in ("billing.hook", "billing.own"):
            sent = billing.post("/v1/messages", json={"destination": destination, "body": "x"})
            assert sent.status_code == 201
        # Then both are delivered
        wait_until(lambda: len(receiver.accepted) == 2)
        assert sorted(a.path for a in receiver.accepted) == ["/hook", "/own"]
        # And localhost, not listed, is still refused to the API
        other = {"transport": "http", "url": f"http://localhost:{receiver.port}/x"}
        refused = billing.put("/v1/routes/billing.other", json=other)
        assert refused.json()["error"]["code"] == "forbidden_address"
