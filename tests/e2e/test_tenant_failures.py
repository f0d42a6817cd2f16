"""A scoped tenant's failed deliveries: a route's ``dead_letter_to`` gives them a home inside the
tenant's names, so its own token reads and redrives them, and neither they nor the tenant's
reading reach the shared ``tarry.error``; setting one outside the token's names is refused."""

from __future__ import annotations

import httpx

from tests.e2e.receiver import wait_until
from tests.tokens import root_token, tenant_token

CONFIG = (
    tenant_token("billing")
    + tenant_token("orders")
    + root_token("receive")
    + """
# the receiver is on loopback, which a token server refuses to routes unless allowed
[egress]
allow = ["127.0.0.1"]
"""
)


def client(url: str, who: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {who}-secret"})


def test_a_routes_failures_go_to_its_dead_letter_queue_which_its_tenant_reads(
    make_server, receiver
) -> None:
    server = make_server(CONFIG)
    receiver.statuses = [400]  # a permanent failure: dead-lettered at the first attempt
    with client(server.url, "billing") as billing, client(server.url, "root") as root:
        # Given billing's route with a dead-letter queue of its own
        assert billing.put("/v1/queues/billing.failures", json={}).status_code == 201
        route = {"transport": "http", "url": receiver.url, "dead_letter_to": "billing.failures"}
        put = billing.put("/v1/routes/billing.hook", json=route)
        assert put.status_code == 201 and put.json()["dead_letter_to"] == "billing.failures"
        # When a message for it fails
        sent = billing.post("/v1/messages", json={"destination": "billing.hook", "body": "x"})
        assert sent.status_code == 201
        # Then billing's own token receives it from its queue, with why it died
        got = billing.post("/v1/queues/billing.failures/receive", json={"wait_ms": 5000})
        [dead] = got.json()["messages"]
        assert dead["headers"]["tarry-original-id"] == sent.json()["id"]
        assert dead["headers"]["tarry-failure"].startswith("http_400: ")
        assert dead["deaths"][0]["reason"] == "delivery_failed"
        # And the shared error queue holds nothing of it
        shared = root.post("/v1/queues/tarry.error/receive", json={"wait_ms": 0})
        assert shared.json()["messages"] == []
        # And billing may redrive it back to its route, which now accepts it
        billing.post("/v1/queues/billing.failures/nack", json={"receipts": [dead["receipt"]]})
        moved = billing.post("/v1/queues/billing.failures/redrive", json={})
        assert moved.json()["moved"] == 1, moved.text
        wait_until(lambda: len(receiver.accepted) == 1)


def test_a_dead_letter_queue_outside_the_tokens_names_is_refused_and_hidden(
    make_server, receiver
) -> None:
    server = make_server(CONFIG)
    with client(server.url, "billing") as billing, client(server.url, "orders") as orders:
        assert orders.put("/v1/queues/orders.failures", json={}).status_code == 201
        route = {"transport": "http", "url": receiver.url, "dead_letter_to": "orders.failures"}
        # When billing points its route's failures at orders' queue
        refused = billing.put("/v1/routes/billing.hook", json=route)
        # Then it is refused, and no route is made
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "not_authorized"
        assert (
            "dead-letter route failures into 'orders.failures'"
            in (refused.json()["error"]["message"])
        )
        assert billing.get("/v1/routes/billing.hook").status_code == 404
        # A bad name is a 400 naming the field
        bad = billing.put("/v1/routes/billing.hook", json={**route, "dead_letter_to": 7})
        assert bad.status_code == 400 and "dead_letter_to" in bad.json()["error"]["message"]


def test_a_route_deleted_with_force_dead_letters_into_its_own_queue(make_server, receiver) -> None:
    server = make_server(CONFIG)
    with client(server.url, "billing") as billing, client(server.url, "root") as root:
        # Given billing's route with a dead-letter queue, and a message waiting for it
        assert billing.put("/v1/queues/billing.failures", json={}).status_code == 201
        route = {"transport": "http", "url": receiver.url, "dead_letter_to": "billing.failures"}
        assert billing.put("/v1/routes/billing.hook", json=route).status_code == 201
        waiting = {"destination": "billing.hook", "body": "x", "delay_ms": 600_000}
        assert billing.post("/v1/messages", json=waiting).status_code == 201
        # When the route is deleted with force
        deleted = billing.delete("/v1/routes/billing.hook", params={"force": "true"})
        assert deleted.json()["dead_lettered"] == 1
        # Then the waiting message is in billing's queue, not in the shared one
        got = billing.post("/v1/queues/billing.failures/receive", json={"wait_ms": 5000})
        [dead] = got.json()["messages"]
        assert dead["headers"]["tarry-failure"].startswith("route_deleted: ")
        assert root.post("/v1/queues/tarry.error/receive", json={}).json()["messages"] == []
    assert receiver.attempts == []
