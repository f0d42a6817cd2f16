"""Routes put at run time are shared by every node of a PostgreSQL cluster: two real
``tarry serve`` nodes on one real PostgreSQL database, a real receiver on a loopback port."""

from __future__ import annotations

import httpx
import pytest

from tarry import Client
from tests.e2e.receiver import wait_until

pytestmark = pytest.mark.postgres


def node_toml(dsn: str) -> str:
    return f'[store]\nengine = "postgres"\ndsn = "{dsn}"\n[journal]\nenabled = false\n'


def _route(url: str, name: str) -> int:
    return httpx.get(f"{url}/v1/routes/{name}", timeout=10).status_code


def test_node_b_sees_and_delivers_to_a_route_node_a_put(make_server, pg_dsn, receiver) -> None:
    # Given two nodes on one database
    a = make_server(node_toml(pg_dsn))
    b = make_server(node_toml(pg_dsn))
    with Client(a.url) as on_a, Client(b.url) as on_b:
        # When node A puts a route
        on_a.put_route("hooks.shared", transport="http", url=receiver.url)
        # Then node B has it in force without a restart, and a message sent there is delivered
        wait_until(lambda: _route(b.url, "hooks.shared") == 200)
        assert on_b.get_route("hooks.shared")["source"] == "api"
        sent = on_b.send("hooks.shared", "from b")
        wait_until(lambda: receiver.accepted)
        assert [x.headers["tarry-id"] for x in receiver.accepted] == [sent.id]
        wait_until(lambda: on_b.get(sent.id).state == "delivered")  # nothing waits for it
        # When node B deletes it, node A no longer has it either
        on_b.delete_route("hooks.shared")
        wait_until(lambda: _route(a.url, "hooks.shared") == 404)
        refused = httpx.post(
            f"{a.url}/v1/messages", json={"destination": "hooks.shared", "body": "x"}, timeout=10
        )
        assert refused.json()["error"]["code"] == "unknown_destination"
