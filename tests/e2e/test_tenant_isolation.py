"""Tenants stay apart (issue 26, findings 1, 2, 3 and the token half of 11): a real `tarry serve`
with several tokens, each scoped to its own names, tried against the other tenant's names the
ways the issue found open."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tarry.config import AuthConfig, TarryConfig, TokenConfig, load_config
from tarry.errors import InvalidArgument
from tests.tokens import tenant_token

HASHED_SECRET = "hashed-secret"
TOKENS = f"""
{tenant_token("billing")}

{tenant_token("orders")}

[[auth.tokens]]
token = "root-secret"
name = "root"
send = ["*"]
receive = ["*"]
admin = ["*"]

[[auth.tokens]]
token = "auditor-secret"
name = "auditor"
read = ["billing.*"]

[[auth.tokens]]
token_sha256 = "{hashlib.sha256(HASHED_SECRET.encode()).hexdigest()}"
name = "hashed"
send = ["billing.*"]

# Routes put through the API to this machine (the tests' discard port) are allowed here;
# without it a token server refuses them (test_route_egress.py).
[egress]
allow = ["127.0.0.1"]

[routes."billing.hook"]
transport = "http"
url = "http://user:pw@127.0.0.1:9/hook"
headers = {{ x-api-key = "hook-secret" }}

[routes."orders.hook"]
transport = "http"
url = "http://127.0.0.1:9/orders"
"""


def code(response: httpx.Response) -> tuple[int, str | None]:
    error = response.json().get("error") if response.status_code >= 400 else None
    return response.status_code, error["code"] if error else None


@pytest.fixture
def clients(make_server: Any) -> Iterator[dict[str, httpx.Client]]:
    server = make_server(TOKENS)
    secrets = {
        "billing": "billing-secret",
        "orders": "orders-secret",
        "root": "root-secret",
        "auditor": "auditor-secret",
    }
    made = {
        who: httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {secret}"})
        for who, secret in secrets.items()
    }
    made["anonymous"] = httpx.Client(base_url=server.url)
    made["_url"] = server.url  # type: ignore[assignment]
    root, billing, orders = made["root"], made["billing"], made["orders"]
    assert billing.put("/v1/queues/billing.q", json={}).status_code == 201
    assert billing.put("/v1/queues/billing.dead", json={}).status_code == 201
    assert billing.put("/v1/topics/billing.t").status_code == 201
    assert orders.put("/v1/queues/orders.q", json={}).status_code == 201
    assert root.get("/v1/queues/orders.q").status_code == 200
    yield made
    for client in made.values():
        if isinstance(client, httpx.Client):
            client.close()


def receive_all(client: httpx.Client, queue: str) -> list[dict[str, Any]]:
    response = client.post(f"/v1/queues/{queue}/receive", json={"max": 100})
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


# --- finding 1: every name an operation touches -------------------------------------------------
def test_finding_01_subscription_target_needs_admin_on_the_queue(clients) -> None:
    billing, orders, root = clients["billing"], clients["orders"], clients["root"]
    response = billing.put("/v1/topics/billing.t/subscriptions/orders.q")
    assert code(response) == (403, "not_authorized")
    assert "orders.q" in response.json()["error"]["message"]
    assert root.get("/v1/topics/billing.t").json()["subscriptions"] == []
    # A publish to the topic reaches no queue of the other tenant.
    assert billing.post("/v1/messages", json={"destination": "billing.t", "body": "x"}).is_success
    assert receive_all(orders, "orders.q") == []
    # Neither side alone: the queue's owner may not subscribe it to another tenant's topic.
    response = orders.put("/v1/topics/billing.t/subscriptions/orders.q")
    assert code(response) == (403, "not_authorized")
    # Its own queue it may subscribe, and an admin of both may join the two.
    assert billing.put("/v1/topics/billing.t/subscriptions/billing.q").status_code == 200
    assert root.put("/v1/topics/billing.t/subscriptions/orders.q").status_code == 200
    assert root.get("/v1/topics/billing.t").json()["subscriptions"] == ["billing.q", "orders.q"]


def test_finding_01_dead_letter_to_needs_send_on_the_target(clients) -> None:
    billing, orders, root = clients["billing"], clients["orders"], clients["root"]
    response = billing.put(
        "/v1/queues/billing.dl", json={"dead_letter_to": "orders.q", "message_ttl_ms": 1}
    )
    assert code(response) == (403, "not_authorized")
    assert "orders.q" in response.json()["error"]["message"]
    assert code(root.get("/v1/queues/billing.dl")) == (404, "not_found")
    # Through a policy's definition too, even one whose pattern is the token's own.
    response = billing.put(
        "/v1/policies/billing.dlx",
        json={"pattern": "^billing\\.", "definition": {"dead_letter_to": "orders.q"}},
    )
    assert code(response) == (403, "not_authorized")
    assert root.get("/v1/policies").json()["items"] == []
    # Dead-lettering into its own queue works, and nothing reached the other tenant.
    response = billing.put(
        "/v1/queues/billing.dl", json={"dead_letter_to": "billing.dead", "message_ttl_ms": 1}
    )
    assert response.status_code == 201
    assert billing.post("/v1/messages", json={"destination": "billing.dl", "body": "x"}).is_success
    deadline = time.monotonic() + 10
    while not (dead := receive_all(billing, "billing.dead")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [m["body"] for m in dead] == ["x"]
    assert receive_all(orders, "orders.q") == []


def test_finding_01_reply_to_with_expiry_report_needs_send_on_it(clients) -> None:
    billing, orders = clients["billing"], clients["orders"]
    hostile = {
        "destination": "billing.q",
        "body": "x",
        "ttl_ms": 1,
        "reply_to": "orders.q",
        "report": ["expiration"],
    }
    response = billing.post("/v1/messages", json=hostile)
    assert code(response) == (403, "not_authorized")
    assert "reply_to 'orders.q'" in response.json()["error"]["message"]
    # In a batch only that send fails; small batches and column-checked big ones alike.
    for size in (2, 300):
        items = [hostile] + [{"destination": "billing.q", "body": str(i)} for i in range(size - 1)]
        response = billing.post("/v1/messages/batch", json={"messages": items})
        assert response.status_code == 200
        results = response.json()["results"]
        assert results[0]["error"]["code"] == "not_authorized"
        assert all("id" in r for r in results[1:]), results[1:3]
    # Its own queue is a fine reply_to, and the expiry report arrives there.
    own = {**hostile, "reply_to": "billing.dead"}
    assert billing.post("/v1/messages", json=own).status_code == 201
    deadline = time.monotonic() + 10
    while not (reports := receive_all(billing, "billing.dead")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reports, "the expiry report to the token's own reply_to queue never came"
    time.sleep(0.5)  # what would have reached orders.q had by now
    assert receive_all(orders, "orders.q") == []


# --- finding 2: a policy's pattern ---------------------------------------------------------------
def test_finding_02_scoped_admin_cannot_set_a_catch_all_operator_policy(clients) -> None:
    billing, root = clients["billing"], clients["root"]
    catch_all = {"pattern": ".*", "operator": True, "definition": {"message_ttl_ms": 0}}
    response = billing.put("/v1/policies/billing.ttl", json=catch_all)
    assert code(response) == (403, "not_authorized")
    assert "admin" in response.json()["error"]["message"]
    for pattern in ("^billing\\.|^orders", "billing\\.", "(?i)^BILLING\\.", "(?m)^billing\\."):
        body = {"pattern": pattern, "definition": {"message_ttl_ms": 0}}
        response = billing.put("/v1/policies/billing.ttl", json=body)
        assert code(response) == (403, "not_authorized"), pattern
    effective = root.get("/v1/queues/orders.q").json()
    assert (effective["effective"]["message_ttl_ms"], effective["effective"]["policy"]) == (
        None,
        None,
    ), effective


def test_finding_02_scoped_admin_may_set_a_policy_inside_its_prefix(clients) -> None:
    billing, root = clients["billing"], clients["root"]
    body = {"pattern": "^billing\\.", "operator": True, "definition": {"message_ttl_ms": 60000}}
    assert billing.put("/v1/policies/billing.ttl", json=body).status_code == 200
    assert root.get("/v1/queues/billing.q").json()["effective"]["message_ttl_ms"] == 60000
    assert root.get("/v1/queues/orders.q").json()["effective"]["message_ttl_ms"] is None
    assert billing.delete("/v1/policies/billing.ttl").status_code == 200
    # A wide policy an admin-of-all set under the tenant's name stays the admin's.
    wide = {"pattern": ".*", "definition": {"max_length": 1000}}
    assert root.put("/v1/policies/billing.wide", json=wide).status_code == 200
    assert code(billing.delete("/v1/policies/billing.wide")) == (403, "not_authorized")
    assert code(billing.put("/v1/policies/billing.wide", json=body)) == (403, "not_authorized")
    assert root.get("/v1/queues/orders.q").json()["effective"]["max_length"] == 1000


# --- finding 3: reads ----------------------------------------------------------------------------
def test_finding_03_message_metadata_needs_read(clients) -> None:
    billing, orders, auditor = clients["billing"], clients["orders"], clients["auditor"]
    secret = {
        "destination": "orders.q",
        "body": "x",
        "delay_ms": 60_000,
        "headers": {"customer": "4711"},
        "correlation_id": "order-42",
    }
    orders_id = orders.post("/v1/messages", json=secret).json()["id"]
    billing_id = billing.post(
        "/v1/messages", json={"destination": "billing.q", "body": "b", "delay_ms": 60_000}
    ).json()["id"]
    for intruder in (billing, auditor):
        response = intruder.get(f"/v1/messages/{orders_id}")
        assert code(response) == (404, "not_found")  # as if it did not exist
        assert "4711" not in response.text and "order-42" not in response.text
    assert orders.get(f"/v1/messages/{orders_id}").json()["headers"] == {"customer": "4711"}
    assert auditor.get(f"/v1/messages/{billing_id}").status_code == 200  # read = billing.*
    assert code(orders.get(f"/v1/messages/{billing_id}")) == (404, "not_found")


def test_finding_03_listing_by_destination_needs_read(clients) -> None:
    billing, orders, root = clients["billing"], clients["orders"], clients["root"]
    orders.post("/v1/messages", json={"destination": "orders.q", "body": "o", "delay_ms": 60_000})
    billing.post("/v1/messages", json={"destination": "billing.q", "body": "b", "delay_ms": 60_000})
    response = billing.get("/v1/messages", params={"destination": "orders.q"})
    assert code(response) == (403, "not_authorized")
    response = billing.get("/v1/messages")  # everything: not for a scoped token
    assert code(response) == (403, "not_authorized")
    assert "destination" in response.json()["error"]["message"]
    items = billing.get("/v1/messages", params={"destination": "billing.q"}).json()["items"]
    assert [m["destination"] for m in items] == ["billing.q"]
    everything = root.get("/v1/messages").json()["items"]
    assert {m["destination"] for m in everything} == {"orders.q", "billing.q"}


def test_finding_03_queue_details_need_read(clients) -> None:
    billing, orders, root, auditor = (
        clients["billing"],
        clients["orders"],
        clients["root"],
        clients["auditor"],
    )
    assert code(billing.get("/v1/queues/orders.q")) == (403, "not_authorized")
    assert code(auditor.get("/v1/queues/orders.q")) == (403, "not_authorized")
    assert auditor.get("/v1/queues/billing.q").status_code == 200
    names = [q["name"] for q in billing.get("/v1/queues").json()["items"]]
    assert names == ["billing.dead", "billing.q"]
    assert "orders.q" in [q["name"] for q in root.get("/v1/queues").json()["items"]]
    assert code(orders.get("/v1/topics/billing.t")) == (403, "not_authorized")
    assert root.put("/v1/policies/orders.p", json={"pattern": "^orders\\."}).status_code == 200
    assert billing.get("/v1/policies").json()["items"] == []
    assert [p["name"] for p in orders.get("/v1/policies").json()["items"]] == ["orders.p"]
    assert code(billing.get("/v1/stats")) == (403, "not_authorized")
    assert root.get("/v1/stats").status_code == 200


def test_finding_03_a_send_only_token_inspects_its_destinations_not_their_messages(
    clients, make_server
) -> None:
    """Who may send to a destination sees what it accepts (a pipeline checks its rows against
    the queue's arguments and needs the route names), never its messages nor other tenants'."""
    url = clients["_url"]
    sender = httpx.Client(base_url=url, headers={"authorization": f"Bearer {HASHED_SECRET}"})
    with sender:
        sent = sender.post("/v1/messages", json={"destination": "billing.q", "delay_ms": 60_000})
        assert sent.status_code == 201, sent.text
        assert sender.get("/v1/queues/billing.q").status_code == 200
        assert [q["name"] for q in sender.get("/v1/queues").json()["items"]] == [
            "billing.dead",
            "billing.q",
        ]
        assert sender.get("/v1/topics/billing.t").status_code == 200
        assert code(sender.get("/v1/queues/orders.q")) == (403, "not_authorized")
        assert code(sender.get(f"/v1/messages/{sent.json()['id']}")) == (404, "not_found")
        assert code(sender.get("/v1/messages", params={"destination": "billing.q"})) == (
            403,
            "not_authorized",
        )
        routes = sender.get("/v1/routes").json()["items"]
        assert [r["name"] for r in routes] == ["billing.hook"]
        assert routes[0]["url"] == "http://***@127.0.0.1:9/hook"
        assert routes[0]["headers"] == {"x-api-key": "***"}
        assert code(sender.get("/v1/routes/orders.hook")) == (403, "not_authorized")
        assert sender.get("/v1/routes/billing.hook").json()["transport"] == "http"
    root_routes = clients["root"].get("/v1/routes").json()["items"]
    assert [r["name"] for r in root_routes] == ["billing.hook", "orders.hook"]
    assert code(clients["root"].get("/v1/routes/nowhere")) == (404, "not_found")


# --- the routes of issues 24 and 25: schedules, routes, redrive, topics, console reads -----------
def test_a_schedule_into_another_tenants_destination_is_neither_shown_nor_named(clients) -> None:
    billing, root = clients["billing"], clients["root"]
    # Given a schedule under billing's name that an admin of all pointed at orders' queue
    into_orders = {"cron": "*/5 * * * *", "destination": "orders.q", "body": "order-secret"}
    assert root.put("/v1/schedules/billing.x", json=into_orders).status_code == 201
    mine = {"cron": "*/5 * * * *", "destination": "billing.q", "body": "b"}
    assert billing.put("/v1/schedules/billing.mine", json=mine).status_code == 201
    # Then billing neither lists nor reads it (its body is orders' future messages)
    listed = billing.get("/v1/schedules")
    assert [s["name"] for s in listed.json()["items"]] == ["billing.mine"]
    for response in (
        billing.get("/v1/schedules/billing.x"),
        billing.put("/v1/schedules/billing.x", json=mine),
        billing.delete("/v1/schedules/billing.x"),
    ):
        assert code(response) == (403, "not_authorized"), response.text
        # and no refusal names the destination
        assert "orders" not in response.text and "order-secret" not in response.text
    assert "orders" not in listed.text
    assert root.get("/v1/schedules/billing.x").json()["destination"] == "orders.q"
    # nor does a token that reads only billing's names
    auditor = clients["auditor"]
    assert [s["name"] for s in auditor.get("/v1/schedules").json()["items"]] == ["billing.mine"]
    assert code(auditor.get("/v1/schedules/billing.x")) == (403, "not_authorized")


def test_a_topic_shows_only_the_subscriptions_a_token_may_inspect(clients) -> None:
    billing, root = clients["billing"], clients["root"]
    # Given orders' queue subscribed to billing's topic by an admin of both
    assert billing.put("/v1/topics/billing.t/subscriptions/billing.q").status_code == 200
    assert root.put("/v1/topics/billing.t/subscriptions/orders.q").status_code == 200
    # Then billing's views of its topic show its own queue only
    assert billing.get("/v1/topics/billing.t").json()["subscriptions"] == ["billing.q"]
    listed = billing.get("/v1/topics").json()["items"]
    assert [(t["name"], t["subscriptions"]) for t in listed] == [("billing.t", ["billing.q"])]
    assert billing.put("/v1/topics/billing.t").json()["subscriptions"] == ["billing.q"]
    # and a publish answers every copy's id, the other tenant's queue as ***
    sent = billing.post("/v1/messages", json={"destination": "billing.t", "delay_ms": 60_000})
    assert sorted(c["queue"] for c in sent.json()["copies"]) == ["***", "billing.q"]
    batch = billing.post(
        "/v1/messages/batch", json={"messages": [{"destination": "billing.t", "delay_ms": 1}]}
    )
    assert sorted(c["queue"] for c in batch.json()["results"][0]["copies"]) == ["***", "billing.q"]
    assert "orders" not in sent.text + batch.text
    assert root.get("/v1/topics/billing.t").json()["subscriptions"] == ["billing.q", "orders.q"]


def test_unsubscribing_another_tenants_queue_needs_admin_on_it(clients) -> None:
    billing, orders, root = clients["billing"], clients["orders"], clients["root"]
    assert root.put("/v1/topics/billing.t/subscriptions/orders.q").status_code == 200
    # Cutting orders' queue off billing's topic changes what orders receives
    response = billing.delete("/v1/topics/billing.t/subscriptions/orders.q")
    assert code(response) == (403, "not_authorized")
    assert root.get("/v1/topics/billing.t").json()["subscriptions"] == ["orders.q"]
    # and the queue's owner alone may not either: it is billing's topic
    assert code(orders.delete("/v1/topics/billing.t/subscriptions/orders.q")) == (
        403,
        "not_authorized",
    )
    assert root.delete("/v1/topics/billing.t/subscriptions/orders.q").status_code == 200


def test_another_tenants_name_inside_a_route_queue_or_policy_is_shown_as_hidden(clients) -> None:
    billing, root = clients["billing"], clients["root"]
    # Given billing's route, queue and policy that an admin of all pointed at orders' names
    route = {"transport": "http", "url": "http://127.0.0.1:9/b", "on_failure_report_to": "orders.q"}
    assert root.put("/v1/routes/billing.r", json=route).status_code == 201
    assert root.put("/v1/queues/billing.dl", json={"dead_letter_to": "orders.q"}).status_code == 201
    policy = {"pattern": "^billing\\.dl$", "definition": {"dead_letter_to": "orders.q"}}
    assert root.put("/v1/policies/billing.p", json=policy).status_code == 200
    limit = {"pattern": "^billing\\.dl$", "operator": True, "definition": {"max_length": 5}}
    assert root.put("/v1/policies/orders.limit", json=limit).status_code == 200
    # Then billing sees them with the other tenant's name as ***
    shown = [
        billing.get("/v1/routes/billing.r").json()["on_failure_report_to"],
        *[r["on_failure_report_to"] for r in billing.get("/v1/routes").json()["items"]],
        billing.get("/v1/queues/billing.dl").json()["arguments"]["dead_letter_to"],
        billing.get("/v1/queues/billing.dl").json()["effective"]["dead_letter_to"],
        *[q["arguments"]["dead_letter_to"] for q in billing.get("/v1/queues").json()["items"]],
        billing.get("/v1/policies").json()["items"][0]["definition"]["dead_letter_to"],
        billing.get("/v1/queues/billing.dl").json()["effective"]["operator_policy"],
    ]
    assert [s for s in shown if s is not None] == ["***"] * 7, shown
    assert billing.get("/v1/queues/billing.dl").json()["effective"]["policy"] == "billing.p"
    # while its own names and the admin's view stay as they are
    assert root.get("/v1/routes/billing.r").json()["on_failure_report_to"] == "orders.q"
    own = {**route, "on_failure_report_to": "billing.q"}
    assert billing.put("/v1/routes/billing.r", json=own).json()["on_failure_report_to"] == (
        "billing.q"
    )


def test_cancel_and_reschedule_of_another_tenants_message_answer_as_missing(clients) -> None:
    billing, orders = clients["billing"], clients["orders"]
    sent = orders.post("/v1/messages", json={"destination": "orders.q", "delay_ms": 60_000})
    message_id = sent.json()["id"]
    # As GET answers it: a refusal would tell that the id is in use, and for which queue
    for response in (
        billing.delete(f"/v1/messages/{message_id}"),
        billing.post(f"/v1/messages/{message_id}/reschedule", json={"delay_ms": 1000}),
    ):
        assert code(response) == (404, "not_found")
        assert "orders" not in response.text
    # A token that reads the message but may not send there is told why
    own = billing.post("/v1/messages", json={"destination": "billing.q", "delay_ms": 60_000})
    response = clients["auditor"].delete(f"/v1/messages/{own.json()['id']}")
    assert code(response) == (403, "not_authorized")
    assert orders.get(f"/v1/messages/{message_id}").json()["state"] == "scheduled"


def test_a_stranger_is_refused_before_the_server_reads_its_body(clients) -> None:
    anonymous = clients["anonymous"]
    for path in ("/v1/messages", "/v1/messages/batch"):
        # A body over the limit and a body that is not JSON: 401 either way, nothing read
        response = anonymous.post(path, content=b"x" * 2_000_000)
        assert code(response) == (401, "unauthenticated"), path
        assert code(anonymous.post(path, content=b"{")) == (401, "unauthenticated"), path
    response = anonymous.post("/v1/messages/01M8AXW9K5PH1BSTE4N9HRD49G/reschedule", content=b"{")
    assert code(response) == (401, "unauthenticated")


def test_healthz_does_not_quote_another_tenants_failing_deliveries(make_server) -> None:
    # Given orders' webhook failing long enough to open the dispatch breaker
    server = make_server(TOKENS + "\n[dispatch]\ntime_to_trigger_dispatch_ms = 100\n")
    auth = {"authorization": "Bearer orders-secret"}
    with httpx.Client(base_url=server.url, headers=auth) as orders:
        deadline = time.monotonic() + 20
        while True:
            sent = orders.post("/v1/messages", json={"destination": "orders.hook", "body": "o"})
            assert sent.status_code == 201, sent.text
            time.sleep(0.2)
            health = orders.get("/healthz").json()
            if "dispatch" in health["open"] or time.monotonic() > deadline:
                break
    assert "dispatch" in health["open"], health
    # Then /healthz answers everyone that deliveries fail, but not where to
    for secret in (None, "billing-secret", "orders-secret"):
        headers = {"authorization": f"Bearer {secret}"} if secret else {}
        seen = httpx.get(f"{server.url}/healthz", headers=headers).json()
        assert seen["status"] == "degraded" and "dispatch" in seen["open"]
        assert "orders" not in seen["reasons"]["dispatch"], (secret, seen)
    # while a token that reads every name sees why
    root = httpx.get(f"{server.url}/healthz", headers={"authorization": "Bearer root-secret"})
    assert "127.0.0.1:9/orders" in root.json()["reasons"]["dispatch"]


# --- finding 11 (tokens) -------------------------------------------------------------------------
def test_finding_11_hashed_tokens_authenticate(clients) -> None:
    url = str(clients["_url"])
    good = {"authorization": f"Bearer {HASHED_SECRET}"}
    with httpx.Client(base_url=url, headers=good) as hashed:
        response = hashed.post("/v1/messages", json={"destination": "billing.q", "body": "h"})
        assert response.status_code == 201, response.text
        response = hashed.post("/v1/messages", json={"destination": "orders.q", "body": "h"})
        assert code(response) == (403, "not_authorized")
    digest = hashlib.sha256(HASHED_SECRET.encode()).hexdigest()
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {digest}"}) as wrong:
        response = wrong.post("/v1/messages", json={"destination": "billing.q", "body": "h"})
        assert code(response) == (401, "unauthenticated")  # the hash is not the secret


def test_finding_11_token_config_takes_exactly_one_secret_and_redacts_both(tmp_path) -> None:
    digest = hashlib.sha256(b"s").hexdigest()
    for body in (
        f'token = "s"\ntoken_sha256 = "{digest}"',
        'name = "none"',
        'token_sha256 = "abc"',
    ):
        path = tmp_path / "tarry.toml"
        path.write_text(f"[[auth.tokens]]\n{body}\n")
        with pytest.raises(InvalidArgument, match="token"):
            load_config(path)
    config = TarryConfig(
        auth=AuthConfig(tokens=[TokenConfig(token="s"), TokenConfig(token_sha256=digest.upper())])
    )
    assert config.auth.tokens[1].token_sha256 == digest
    shown = config.redacted()["auth"]["tokens"]
    assert [(t["token"], t["token_sha256"]) for t in shown] == [("***", None), (None, "***")]
    result = subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "token", "hash", "--token", "s"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout.strip()) == (0, digest)


def test_finding_11_lowercase_bearer_scheme_is_accepted(clients) -> None:
    url = str(clients["_url"])
    for scheme in ("bearer", "BEARER", "Bearer"):
        headers = {"authorization": f"{scheme} billing-secret"}
        with httpx.Client(base_url=url, headers=headers) as client:
            assert client.get("/v1/queues/billing.q").status_code == 200, scheme
    with httpx.Client(base_url=url, headers={"authorization": "Basic billing-secret"}) as client:
        assert code(client.get("/v1/queues/billing.q")) == (401, "unauthenticated")
