"""The API pieces the console reads (issue 24), against a real ``tarry serve``: the page itself,
the due forecast, the recent rates and lateness, dead letters by reason and original
destination, the topic list and a body's preview; each honours the tokens' scopes."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.tokens import tenant_token

TOKENS = f"""
[[auth.tokens]]
token = "root-secret"
send = ["*"]
receive = ["*"]
admin = ["*"]

{tenant_token("billing")}

[queues."billing.q"]
dead_letter_to = "billing.dead"
[queues."billing.dead"]
[queues."orders.q"]
dead_letter_to = "orders.dead"
[queues."orders.dead"]

[topics]
"billing.news" = ["billing.q"]
"orders.news" = ["orders.q"]
"""
MINUTE = 60_000


@pytest.fixture
def clients(make_server: Any) -> Iterator[tuple[httpx.Client, httpx.Client, httpx.Client]]:
    server = make_server(TOKENS)
    made = [
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {secret}"})
        for secret in ("root-secret", "billing-secret")
    ]
    made.append(httpx.Client(base_url=server.url))
    yield made[0], made[1], made[2]
    for client in made:
        client.close()


def send(client: httpx.Client, destination: str, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/messages", json={"destination": destination, **fields})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def dead_letter(client: httpx.Client, queue: str, body: str) -> None:
    send(client, queue, body=body)
    got = client.post(f"/v1/queues/{queue}/receive", json={"max": 1, "wait_ms": 5000}).json()
    [message] = got["messages"]
    answer = client.post(
        f"/v1/queues/{queue}/nack", json={"receipts": [message["receipt"]], "requeue": False}
    )
    assert answer.json()["nacked"] == 1


def test_console_page_is_served_with_its_files_and_a_strict_content_policy(clients) -> None:
    _, _, anonymous = clients
    page = anonymous.get("/console")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/console/console.js"' in page.text
    script = anonymous.get("/console/console.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "Authorization" in script.text and "sessionStorage" in script.text
    assert anonymous.get("/console/console.css").status_code == 200
    missing = anonymous.get("/console/secrets.txt")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_forecast_counts_scheduled_messages_per_minute_hour_and_day(clients) -> None:
    root, billing, _ = clients
    # Given messages due in 5 and 7 minutes, in 3 hours and in 10 days, and a cancelled one
    for delay in (5 * MINUTE, 7 * MINUTE, 180 * MINUTE, 10 * 1440 * MINUTE):
        send(root, "orders.q", body="x", delay_ms=delay)
    gone = send(root, "orders.q", body="x", delay_ms=6 * MINUTE)
    root.delete(f"/v1/messages/{gone['id']}")
    # When the forecast is asked for
    forecast = root.get("/v1/stats/forecast").json()
    # Then each series starts at the current minute and counts what falls in its windows
    assert forecast["scheduled"] == 4
    hour, day, month = forecast["next_hour"], forecast["next_day"], forecast["next_30_days"]
    assert hour["start"] == forecast["computed_at"] - forecast["computed_at"] % MINUTE
    assert (hour["width_ms"], len(hour["counts"])) == (MINUTE, 60)
    # (the log store shares a 5-minute partition's count among its minutes)
    assert sum(hour["counts"]) == 2 and hour["counts"][0] == 0
    assert (len(day["counts"]), sum(day["counts"])) == (24, 3)
    assert (len(month["counts"]), sum(month["counts"]), month["counts"][10]) == (30, 4, 1)
    # and a token that does not read every tenant may not see it
    refused = billing.get("/v1/stats/forecast")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "not_authorized")


def test_recent_activity_counts_messages_in_and_out_with_their_lateness(clients) -> None:
    root, billing, _ = clients
    for _ in range(3):
        send(root, "orders.q", body="now")
    send(root, "orders.q", body="soon", delay_ms=200)
    deadline = time.monotonic() + 10
    while True:
        recent = root.get("/v1/stats/recent").json()
        if sum(w["out"] for w in recent["windows"]) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sum(w["in"] for w in recent["windows"]) == 4
    assert sum(w["out"] for w in recent["windows"]) == 4
    assert len(recent["windows"]) == 10 * 60_000 // recent["window_ms"]
    assert 0 <= recent["lateness_p50_ms"] <= recent["lateness_p99_ms"] <= recent["lateness_max_ms"]
    assert billing.get("/v1/stats/recent").status_code == 403


def test_dead_letters_are_grouped_by_reason_and_original_destination_per_readable_queue(
    clients,
) -> None:
    root, billing, _ = clients
    dead_letter(root, "billing.q", "a")
    dead_letter(root, "billing.q", "b")
    dead_letter(root, "orders.q", "c")
    everything = {q["queue"]: q["groups"] for q in root.get("/v1/dead-letters").json()["items"]}
    assert set(everything) == {"billing.dead", "orders.dead", "tarry.error"}
    [group] = everything["billing.dead"]
    assert (group["reason"], group["original_destination"], group["count"]) == (
        "rejected",
        "billing.q",
        2,
    )
    assert group["oldest"] <= group["newest"]
    assert everything["tarry.error"] == []
    # A scoped token sees only its own dead-letter queues
    mine = billing.get("/v1/dead-letters").json()["items"]
    assert [q["queue"] for q in mine] == ["billing.dead"]


def test_topics_are_listed_with_their_subscriptions_for_the_names_a_token_may_inspect(
    clients,
) -> None:
    root, billing, anonymous = clients
    listed = root.get("/v1/topics").json()["items"]
    assert [(t["name"], t["subscriptions"]) for t in listed] == [
        ("billing.news", ["billing.q"]),
        ("orders.news", ["orders.q"]),
    ]
    assert [t["name"] for t in billing.get("/v1/topics").json()["items"]] == ["billing.news"]
    assert anonymous.get("/v1/topics").status_code == 401


def test_body_preview_returns_the_first_bytes_to_readers_only(clients) -> None:
    root, billing, _ = clients
    body = bytes(range(256)) * 4
    sent = send(
        root,
        "orders.q",
        body_base64=base64.b64encode(body).decode(),
        delay_ms=MINUTE,
    )
    preview = root.get(f"/v1/messages/{sent['id']}/body", params={"max_bytes": 10}).json()
    assert preview == {
        "id": sent["id"],
        "size": 1024,
        "body_base64": base64.b64encode(body[:10]).decode(),
        "truncated": True,
    }
    whole = root.get(f"/v1/messages/{sent['id']}/body").json()
    assert (base64.b64decode(whole["body_base64"]), whole["truncated"]) == (body, False)
    # Another tenant's message does not exist for this token
    hidden = billing.get(f"/v1/messages/{sent['id']}/body")
    assert (hidden.status_code, hidden.json()["error"]["code"]) == (404, "not_found")
    bad = root.get(f"/v1/messages/{sent['id']}/body", params={"max_bytes": 0})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_argument")
