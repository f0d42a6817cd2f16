"""Each feature end to end against a real server, through the Python clients."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest

import tarry
from tarry import AsyncClient, Client


@pytest.fixture
def client(server):
    with Client(server.url) as c:
        yield c


def wait_for(predicate, timeout_s: float = 5.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_message_ttl_expires_and_dead_letters_with_deaths(client: Client) -> None:
    client.declare_queue("dlq")
    client.declare_queue("orders", dead_letter_to="dlq")
    sent = client.send("orders", "late", ttl="200ms")
    [dead] = client.receive("dlq", wait="3s")
    assert dead.body == b"late" and dead.deaths[0]["reason"] == "expired"
    assert dead.headers["tarry-original-id"] == sent.id
    assert client.get(sent.id).state == "dead_lettered"
    assert client.receive("orders") == []


def test_queue_ttl_zero_expires_unless_a_consumer_waits(client: Client) -> None:
    client.declare_queue("now-or-never", message_ttl=0)
    lost = client.send("now-or-never", "nobody")
    assert client.get(lost.id).state == "expired"


async def test_queue_ttl_zero_hands_over_to_a_waiting_consumer(server) -> None:
    async with AsyncClient(server.url) as c:
        await c.declare_queue("handoff", message_ttl=0)
        waiting = asyncio.create_task(c.receive("handoff", wait="5s"))
        await asyncio.sleep(0.3)
        sent = await c.send("handoff", "taken")
        [got] = await waiting
    assert got.id == sent.id


def test_an_unused_queue_expires(client: Client) -> None:
    client.declare_queue("temp", expires="300ms")
    wait_for(lambda: "temp" not in [q.name for q in client.list_queues()])
    with pytest.raises(tarry.NotFound):
        client.get_queue("temp")


def test_max_length_drop_head_dead_letters_the_oldest(client: Client) -> None:
    client.declare_queue("dlq2")
    client.declare_queue("short", max_length=2, dead_letter_to="dlq2")
    ids = [client.send("short", str(i)).id for i in range(3)]
    assert [m.id for m in client.receive("short", max=10)] == ids[1:]
    [dropped] = client.receive("dlq2")
    assert dropped.deaths[0]["reason"] == "maxlen"


def test_policies_apply_the_lowest_ttl(client: Client) -> None:
    client.declare_queue("billing.eu", message_ttl="1h")
    client.put_policy("billing", pattern="^billing\\.", definition={"message_ttl_ms": 200})
    info = client.get_queue("billing.eu")
    assert info.effective["message_ttl_ms"] == 200 and info.effective["policy"] == "billing"
    sent = client.send("billing.eu", "x")
    wait_for(lambda: client.get(sent.id).state == "expired")


def test_a_topic_fans_out_at_send_time(client: Client) -> None:
    for q in ("mail", "sms"):
        client.declare_queue(q)
    client.declare_topic("alerts")
    client.subscribe("alerts", "mail")
    client.subscribe("alerts", "sms")
    result = client.send("alerts", "fire", delay="200ms")
    assert sorted(q for _, q in result.copies) == ["mail", "sms"]
    assert [m.text for m in client.receive("mail", wait="3s")] == ["fire"]
    assert [m.text for m in client.receive("sms", wait="3s")] == ["fire"]


def test_expiration_and_exception_reports_reach_reply_to(client: Client) -> None:
    client.declare_queue("reports")
    client.declare_queue("work")
    client.declare_queue("doomed")
    expiring = client.send("work", "x", ttl="100ms", reply_to="reports", report=["expiration"])
    failing = client.send("doomed", "y", delay="300ms", reply_to="reports", report=["exception"])
    client.delete_queue("doomed")
    got = client.receive("reports", max=10, wait="3s")
    while len(got) < 2:
        got += client.receive("reports", max=10, wait="3s")
    kinds = {orjson.loads(m.body)["id"]: m.headers["tarry-report"] for m in got}
    assert kinds == {expiring.id: "expiration", failing.id: "exception"}
    [err] = client.receive("tarry.error", wait="1s")
    assert err.deaths[0]["reason"] == "delivery_failed"


def test_cancel_and_reschedule(client: Client) -> None:
    client.declare_queue("plans")
    a = client.send("plans", "a", delay="10s")
    b = client.send("plans", "b", delay="10s")
    assert client.cancel(a.id)["state"] == "cancelled"
    moved = client.reschedule(b.id, delay="100ms")
    assert moved.deliver_at < b.deliver_at
    [got] = client.receive("plans", wait="3s")
    assert got.id == b.id
    with pytest.raises(tarry.NotCancellable):
        client.cancel(b.id)


def test_a_repeated_message_id_stores_nothing_new(client: Client) -> None:
    client.declare_queue("idem")
    first = client.send("idem", "one", message_id="order-42", delay="1h")
    again = client.send("idem", "two", message_id="order-42", delay="1h")
    assert again.id == first.id and again.duplicate
    assert client.get_queue("idem").scheduled == 1


def test_a_big_batch_answers_each_item_as_a_single_send_would(server) -> None:
    # Given a batch big enough to be checked column-wise, good and bad items mixed
    httpx.put(f"{server.url}/v1/queues/big", json={}).raise_for_status()
    httpx.put(f"{server.url}/v1/queues/big.off", json={"put_enabled": False}).raise_for_status()
    bad = [
        {"destination": "big", "delay_ms": -1},
        {"destination": "big", "delay_ms": 5, "deliver_at": 5},
        {"destination": "big", "delay_ms": 10_000, "ttl_ms": 10},
        {"destination": "big", "delay_ms": "soon"},
        {"destination": "big", "message_id": ""},
        {"destination": "nowhere"},
        {"destination": "big.off"},
        {"destination": "bad name"},
        {"destination": "big", "delay_ms": 10, "group_id": "g"},
        {"destination": "big", "bogus": 1},
        "not an object",
    ]
    items = [{"destination": "big", "body": f"m{i}", "delay_ms": 60_000} for i in range(300)]
    for k, item in enumerate(bad):
        items.insert(k * 29, item)
    # When it is sent in one request
    response = httpx.post(f"{server.url}/v1/messages/batch", json={"messages": items})
    results = response.json()["results"]
    # Then every bad item gets the error it gets alone, and the good ones are scheduled
    assert response.status_code == 200 and len(results) == len(items)
    for item, result in zip(items, results, strict=True):
        if not isinstance(item, dict):  # alone it would be a malformed body, not an item
            assert result == {
                "error": {"code": "invalid_argument", "message": "a message must be a JSON object"}
            }
            continue
        if item in bad:
            alone = httpx.post(f"{server.url}/v1/messages", json=item)
            assert alone.status_code >= 400 and result == {"error": alone.json()["error"]}, item
        else:
            assert result["state"] == "scheduled" and result["deliver_at"] > 0, item


def test_listing_filters_and_pages(client: Client) -> None:
    client.declare_queue("many")
    ids = [client.send("many", str(i), delay=f"{10 + i}s", correlation_id="c").id for i in range(7)]
    page = client.list(destination="many", limit=3)
    assert [m.id for m in page.items] == ids[:3] and page.next_cursor
    assert [m.id for m in client.iter_messages(destination="many", limit=3)] == ids
    assert len(client.list(correlation_id="c", state="scheduled").items) == 7


def test_nack_requeues_or_dead_letters(client: Client) -> None:
    client.declare_queue("rejects")
    client.declare_queue("jobs", dead_letter_to="rejects")
    client.send("jobs", "x")
    [m] = client.receive("jobs")
    client.nack("jobs", [m.receipt], requeue=True)
    [again] = client.receive("jobs")
    assert again.redelivered
    client.nack("jobs", [again.receipt], requeue=False)
    [dead] = client.receive("rejects")
    assert dead.deaths[0]["reason"] == "rejected"


def test_binary_bodies_round_trip(client: Client) -> None:
    client.declare_queue("bin")
    payload = bytes(range(256))
    client.send("bin", payload)
    [m] = client.receive("bin")
    assert m.body == payload


def test_health_metrics_and_openapi(server, client: Client) -> None:
    assert client.health()["status"] == "ok"
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    for path in (
        "/v1/messages",
        "/v1/messages/batch",
        "/v1/messages/{message_id}",
        "/v1/queues/{name}",
        "/v1/queues/{name}/receive",
        "/v1/topics/{name}",
        "/v1/policies/{name}",
        "/healthz",
        "/metrics",
    ):
        assert path in paths
    assert "tarry_messages_total" in httpx.get(f"{server.url}/metrics").text


def test_the_journal_records_every_state_change(server, client: Client) -> None:
    client.declare_queue("journaled")
    sent = client.send("journaled", "x")
    [m] = client.receive("journaled")
    client.ack("journaled", [m.receipt])
    server.stop()
    lines = [
        orjson.loads(line)
        for f in (server.data_dir / "journal").glob("*.jsonl")
        for line in f.read_bytes().splitlines()
    ]
    events = [e["event"] for e in lines if e["id"] == sent.id]
    assert events == ["scheduled", "released", "received", "acked"]
    assert len({frozenset(e) for e in lines}) == 1  # one schema for every line
