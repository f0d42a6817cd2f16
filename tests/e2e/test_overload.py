"""Releases first: a real `tarry serve` far behind on releases refuses sends with `429
overloaded` and a `Retry-After` (nothing stored), shows the lag in /healthz and /metrics, and
takes sends again once it caught up."""

from __future__ import annotations

import time

import httpx
import pytest

import tarry

# Small release rounds, so that a few thousand messages due at once keep the server behind for
# seconds (each a queue-database transaction: a release into the queues kept in memory costs
# so little that the server catches up before the test can see it behind); a low limit, so that
# it refuses soon.
CONFIG = """
[dispatch]
batch_size = 5
overload_lag_ms = 150
[store]
queues_in_memory = false
"""


def _flood(client: httpx.Client, count: int, due_in_ms: int) -> None:
    """``count`` messages all due at one time ``due_in_ms`` from now."""
    deliver_at = int(time.time() * 1000) + due_in_ms
    for start in range(0, count, 2_000):
        batch = [
            {"destination": "q", "body": f"m{n}", "deliver_at": deliver_at}
            for n in range(start, min(count, start + 2_000))
        ]
        response = client.post("/v1/messages/batch", json={"messages": batch})
        response.raise_for_status()
        assert all("id" in r for r in response.json()["results"])


def test_a_server_behind_on_releases_refuses_sends_with_429_and_takes_them_again(
    make_server,
) -> None:
    server = make_server(CONFIG)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        # On time: accepted.
        assert (
            client.post("/v1/messages", json={"destination": "q", "body": "x"}).status_code == 201
        )
        assert client.get("/healthz").json()["release_lag_ms"] <= 150

        _flood(client, 12_000, due_in_ms=2_500)
        refused: httpx.Response | None = None
        deadline = time.monotonic() + 20
        probe = 0
        while refused is None and time.monotonic() < deadline:
            probe += 1
            response = client.post(
                "/v1/messages",
                json={"destination": "q", "body": "probe", "message_id": f"probe-{probe}"},
            )
            if response.status_code == 429:
                refused = response
            else:
                assert response.status_code == 201, response.text
                time.sleep(0.02)
        assert refused is not None, "the server never fell behind by 150 ms"
        error = refused.json()["error"]
        assert error["code"] == "overloaded"
        assert "overload_lag_ms" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # Nothing of the refused send was stored.
        listed = client.get(
            "/v1/messages", params={"destination": "q", "message_id": f"probe-{probe}"}
        ).json()
        assert listed["items"] == []
        # The client raises the typed, retryable error; the batch route refuses whole.
        with tarry.Client(server.url) as typed, pytest.raises(tarry.Overloaded) as raised:
            typed.send("q", "typed")
        assert raised.value.code == "overloaded" and raised.value.retry_after_s >= 1
        batch = client.post(
            "/v1/messages/batch", json={"messages": [{"destination": "q", "body": "b"}]}
        )
        assert batch.status_code == 429 and batch.json()["error"]["code"] == "overloaded"
        assert int(batch.headers["retry-after"]) >= 1
        health = client.get("/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "degraded" and "overload" in health.json()["open"]
        assert health.json()["release_lag_ms"] > 150
        # The lag in /metrics (and /healthz, while refused).
        metrics = client.get("/metrics").text
        assert "tarry_release_lag_seconds" in metrics

        # Caught up: accepted again, and healthz is ok.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            health = client.get("/healthz").json()
            if health["release_lag_ms"] <= 150 and "overload" not in health["open"]:
                break
            assert health["status"] == "degraded" and "overload" in health["reasons"]
            time.sleep(0.1)
        else:
            pytest.fail(f"still behind after 60 s: {health}")
        accepted = client.post("/v1/messages", json={"destination": "q", "body": "after"})
        assert accepted.status_code == 201, accepted.text
