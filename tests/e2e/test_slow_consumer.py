"""Releases first, at the consumer's end: a real `tarry serve` whose consumer of one queue falls
behind refuses sends to that queue with `429 overloaded` and a `Retry-After` (nothing stored),
while a queue nobody reads keeps taking sends; the lag shows in /healthz, /metrics and
/v1/stats; once the consumer catches up, sends are taken again, and every accepted message is
received once."""

from __future__ import annotations

import time

import httpx
import pytest

CONFIG = """
[dispatch]
overload_lag_ms = 300
"""


def _send(client: httpx.Client, queue: str, message_id: str) -> httpx.Response:
    return client.post(
        "/v1/messages", json={"destination": queue, "body": "x", "message_id": message_id}
    )


def _drain(client: httpx.Client, queue: str) -> list[str]:
    """Receive and ack until the queue is empty; the ids received."""
    got: list[str] = []
    while True:
        messages = client.post(f"/v1/queues/{queue}/receive", json={"max": 100}).json()["messages"]
        if not messages:
            return got
        got += [m["id"] for m in messages]
        receipts = [m["receipt"] for m in messages]
        client.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts}).raise_for_status()


def test_a_slow_consumer_makes_sends_to_its_queue_refused_and_no_other(make_server) -> None:
    _slow_consumer_case(make_server(CONFIG).url)


@pytest.mark.postgres
def test_the_same_on_postgresql(make_server, pg_dsn: str) -> None:
    # The sampler's look at a queue is the PostgreSQL queue table's, in the same words.
    store = f'[store]\nengine = "postgres"\ndsn = "{pg_dsn}"\n[journal]\nenabled = false\n'
    _slow_consumer_case(make_server(store + CONFIG).url)


def _slow_consumer_case(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        for queue in ("slow", "unread"):
            client.put(f"/v1/queues/{queue}", json={}).raise_for_status()
        accepted: list[str] = []
        # Given a consumer that took 10 messages of "slow" and then stopped, and 200 more ready
        # there, and 200 ready in "unread", which nobody receives from.
        batch = [{"destination": "slow", "body": f"s{n}"} for n in range(210)]
        batch += [{"destination": "unread", "body": f"u{n}"} for n in range(200)]
        results = client.post("/v1/messages/batch", json={"messages": batch}).json()["results"]
        accepted += [r["id"] for r in results[:210]]
        taken = client.post("/v1/queues/slow/receive", json={"max": 10}).json()["messages"]
        assert len(taken) == 10
        receipts = [m["receipt"] for m in taken]
        client.post("/v1/queues/slow/ack", json={"receipts": receipts}).raise_for_status()
        received = [m["id"] for m in taken]

        # When the oldest ready message of "slow" waits longer than 150 ms (half the limit)
        refused: httpx.Response | None = None
        deadline = time.monotonic() + 10
        probe = 0
        while refused is None and time.monotonic() < deadline:
            probe += 1
            response = _send(client, "slow", f"probe-{probe}")
            if response.status_code == 429:
                refused = response
            else:
                assert response.status_code == 201, response.text
                accepted.append(response.json()["id"])
                time.sleep(0.05)

        # Then sends to it are refused, retryable, and nothing of them is stored
        assert refused is not None, "sends to the slow consumer's queue were never refused"
        error = refused.json()["error"]
        assert error["code"] == "overloaded" and error["queue"] == "slow"
        assert error["delivery_lag_ms"] > 150 and "overload_lag_ms" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        listed = client.get(
            "/v1/messages", params={"destination": "slow", "message_id": f"probe-{probe}"}
        ).json()
        assert listed["items"] == []
        # ... a batch of sends to it alone is refused whole, with Retry-After
        whole = client.post(
            "/v1/messages/batch", json={"messages": [{"destination": "slow", "body": "b"}]}
        )
        assert whole.status_code == 429 and int(whole.headers["retry-after"]) >= 1
        # ... a batch for it and another queue: each send answered on its own
        mixed = client.post(
            "/v1/messages/batch",
            json={
                "messages": [
                    {"destination": "slow", "body": "m1"},
                    {"destination": "unread", "body": "m2"},
                ]
            },
        )
        assert mixed.status_code == 200
        one, other = mixed.json()["results"]
        assert one["error"]["code"] == "overloaded" and one["error"]["retry_after_s"] >= 1
        assert "id" in other
        # ... and the queue nobody reads, whose messages are older still, takes sends.
        assert _send(client, "unread", "still welcome").status_code == 201

        # The lag is visible: /healthz (no queue names), /metrics, /v1/stats (per queue).
        health = client.get("/healthz").json()
        assert health["delivery_lag_ms"] > 150 and health["queues_behind"] == 1
        assert "unread" not in str(health) and "slow" not in str(health)
        metrics = client.get("/metrics").text
        assert any(
            line.startswith("tarry_delivery_lag_seconds ") and float(line.split()[-1]) > 0.15
            for line in metrics.splitlines()
        )
        assert "tarry_queues_behind 1.0" in metrics
        lags = client.get("/v1/stats").json()["delivery_lag_ms"]
        assert lags["slow"] > 150 and "unread" not in lags

        # When the consumer catches up, sends are taken again.
        received += _drain(client, "slow")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            response = _send(client, "slow", "after")
            if response.status_code == 201:
                accepted.append(response.json()["id"])
                break
            assert response.status_code == 429
            time.sleep(0.1)
        else:
            raise AssertionError("sends to the drained queue were still refused after 10 s")
        assert client.get("/healthz").json()["queues_behind"] == 0
        received += _drain(client, "slow")

        # Nothing accepted was lost or received twice.
        assert sorted(received) == sorted(accepted)
