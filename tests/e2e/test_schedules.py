"""Recurring schedules against a real `tarry serve`: the HTTP API, the CLI and the Python clients
manage one; its occurrences arrive as ordinary messages, never early; bad input is a 400 that
says what to fix; tokens are checked on the schedule's name and its destination; and a kill -9
during an occurrence loses none and repeats none."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from tarry import AsyncClient, Client
from tarry.errors import InvalidArgument, NotAuthorized, NotFound, UnknownDestination
from tests.conftest import ServerProcess
from tests.tokens import tenant_token

#: Occurrences stored 2 s ahead, topped up every 200 ms: a restart crosses stored occurrences
#: and occurrences not stored yet.
SCHEDULES = """
[journal]
enabled = false
[schedules]
horizon_ms = 2000
interval_ms = 200
[queues.q]
"""


def tarry(
    server: ServerProcess, *args: str, token: str | None = None
) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tarry.cli.main", "--url", server.url, *args]
    if token:
        command[4:4] = ["--token", token]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def occurrence_ms(message_id: str) -> int:
    return int(message_id.split(":")[2])


def ids_per_occurrence(got: list[tuple[dict, float]]) -> Counter[int]:
    """How many distinct messages (ids) each occurrence was stored as: a message received
    again (its ack lost with a killed node) counts once."""
    ids: dict[int, set[str]] = {}
    for m, _ in got:
        ids.setdefault(occurrence_ms(m["message_id"]), set()).add(m["id"])
    return Counter({at: len(found) for at, found in ids.items()})


def receive_all(
    url: str, seconds: float, *, token: str | None = None, visibility_ms: int | None = None
) -> list[tuple[dict, float]]:
    """Receive (and ack) from q for ``seconds``: each message with the time it was received.
    Should the server go away (killed), what was received so far is returned; the error is
    raised only when nothing was."""
    got: list[tuple[dict, float]] = []
    headers = {"authorization": f"Bearer {token}"} if token else {}
    deadline = time.time() + seconds
    with httpx.Client(timeout=10, headers=headers) as client:
        while time.time() < deadline:
            asked: dict[str, int] = {"max": 100, "wait_ms": 300}
            if visibility_ms is not None:
                asked["visibility_ms"] = visibility_ms
            try:
                answer = client.post(f"{url}/v1/queues/q/receive", json=asked)
                messages = answer.json()["messages"]
                now = time.time() * 1000
                got += [(m, now) for m in messages]
                if messages:
                    receipts = [m["receipt"] for m in messages]
                    client.post(f"{url}/v1/queues/q/ack", json={"receipts": receipts})
            except httpx.HTTPError:
                if not got:
                    raise
                return got
    return got


def test_a_schedule_is_managed_by_api_cli_and_client_and_delivers_on_time(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server(SCHEDULES)
    # Given a schedule every second in Paris, put with the Python client
    with Client(server.url) as client:
        info = client.put_schedule(
            "tick", cron="* * * * * *", timezone="Europe/Paris", destination="q", body="hi"
        )
        assert info["cron"] == "* * * * * *" and info["timezone"] == "Europe/Paris"
        first = info["next"][0]
        assert first["message_id"] == f"sched:tick:{first['at']}"
        assert first["local"].endswith("+01:00") or first["local"].endswith("+02:00")
        # Then its occurrences arrive as ordinary messages, each once, never before its time
        got = receive_all(server.url, 3.5)
        ids = [m["message_id"] for m, _ in got]
        assert len(ids) >= 3 and len(set(ids)) == len(ids)
        assert all(m["body"] == "hi" and at >= occurrence_ms(m["message_id"]) for m, at in got)
        seconds = sorted(occurrence_ms(i) for i in ids)
        assert seconds == list(range(seconds[0], seconds[-1] + 1, 1000))
        # and the ones stored ahead are listed like any message
        ahead = client.list(correlation_id="sched:tick", state="scheduled")
        assert ahead.items and all(i.message_id.startswith("sched:tick:") for i in ahead.items)

    # The CLI: put, show, ls, delete
    put = tarry(
        server,
        "schedule",
        "put",
        "weekdays",
        "--cron",
        "0 9 * * 1-5",
        "--tz",
        "America/New_York",
        "--to",
        "q",
        "good morning",
        "--catch-up",
        "once",
        "--json",
    )
    assert put.returncode == 0, put.stderr
    weekdays = orjson.loads(put.stdout)
    assert weekdays["catch_up"] == "once" and weekdays["next"][0]["local"][11:19] == "09:00:00"
    shown = tarry(server, "schedule", "show", "weekdays")
    assert shown.returncode == 0 and "America/New_York" in shown.stdout
    listed = orjson.loads(tarry(server, "schedule", "ls", "--json").stdout)
    assert sorted(s["name"] for s in listed) == ["tick", "weekdays"]
    deleted = tarry(server, "schedule", "delete", "weekdays")
    assert deleted.returncode == 0 and "1 stored occurrence(s) cancelled" in deleted.stdout

    # A bad cron expression or zone: 400 with what to fix, from the API, the CLI and the client
    bad = httpx.put(
        f"{server.url}/v1/schedules/bad", json={"cron": "0 25 * * *", "destination": "q"}
    )
    assert bad.status_code == 400
    assert bad.json()["error"] == {
        "code": "invalid_argument",
        "message": "cron '0 25 * * *' is not valid: Bad hour",
    }
    zone = httpx.put(
        f"{server.url}/v1/schedules/bad",
        json={"cron": "0 9 * * *", "timezone": "Europe/Pari", "destination": "q"},
    )
    assert zone.status_code == 400 and "not a known IANA time zone" in zone.text
    cli = tarry(server, "schedule", "put", "bad", "--cron", "* * *", "--to", "q")
    assert cli.returncode == 1 and cli.stderr.startswith("invalid_argument: cron '* * *' has 3")
    with Client(server.url) as client, pytest.raises(UnknownDestination):
        client.put_schedule("bad", cron="* * * * *", destination="nowhere")

    # The async client reads and deletes it; then it is gone and nothing more arrives
    async def with_async() -> dict[str, Any]:
        async with AsyncClient(server.url) as client:
            assert (await client.get_schedule("tick"))["name"] == "tick"
            return await client.delete_schedule("tick")

    import asyncio

    deleted_at = time.time() * 1000
    answer = asyncio.run(with_async())
    assert answer["deleted"] is True and answer["cancelled"] >= 1
    with Client(server.url) as client, pytest.raises(NotFound):
        client.get_schedule("tick")
    # (what was already released into q stays there; nothing due later comes)
    late = receive_all(server.url, 1.5)
    assert all(occurrence_ms(m["message_id"]) <= deleted_at + 1000 for m, _ in late)
    assert httpx.get(f"{server.url}/v1/schedules").json() == {"items": []}


TOKENS = f"""
{tenant_token("billing")}

[[auth.tokens]]
token = "sender-secret"
name = "sender"
send = ["*"]

[queues."billing.q"]
[queues."orders.q"]
"""


def test_a_schedule_needs_admin_on_its_name_and_send_on_its_destination(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server(TOKENS)
    billing = Client(server.url, token="billing-secret")
    sender = Client(server.url, token="sender-secret")
    try:
        # A tenant's token schedules within its names
        billing.put_schedule("billing.daily", cron="0 9 * * *", destination="billing.q")
        # but not into another tenant's destination, nor under another tenant's name
        with pytest.raises(NotAuthorized):
            billing.put_schedule("billing.spy", cron="0 9 * * *", destination="orders.q")
        with pytest.raises(NotAuthorized, match="admin"):
            billing.put_schedule("orders.daily", cron="0 9 * * *", destination="billing.q")
        # A token that may only send cannot set, read or delete a schedule
        with pytest.raises(NotAuthorized):
            sender.put_schedule("orders.daily", cron="0 9 * * *", destination="orders.q")
        with pytest.raises(NotAuthorized):
            sender.get_schedule("billing.daily")
        with pytest.raises(NotAuthorized):
            sender.delete_schedule("billing.daily")
        assert sender.list_schedules() == []
        assert [s["name"] for s in billing.list_schedules()] == ["billing.daily"]
        assert billing.delete_schedule("billing.daily")["cancelled"] == 1
        with pytest.raises(InvalidArgument):
            billing.put_schedule("billing.x", cron="@sometimes", destination="billing.q")
    finally:
        billing.close()
        sender.close()


KILLED_VISIBILITY_MS = 1500


def test_a_kill_during_an_occurrence_loses_none_and_repeats_none(
    make_server: Callable[..., ServerProcess],
) -> None:
    # Given a schedule every second and a consumer
    server = make_server(SCHEDULES)
    httpx.put(
        f"{server.url}/v1/schedules/tick", json={"cron": "* * * * * *", "destination": "q"}
    ).raise_for_status()
    got: list[tuple[dict, float]] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            try:
                # A short visibility: a message the killed server handed out (its answer or
                # its ack lost in the kill) comes back within the test.
                got.extend(receive_all(server.url, 0.5, visibility_ms=KILLED_VISIBILITY_MS))
            except (httpx.HTTPError, KeyError, ValueError):
                time.sleep(0.1)  # the server is down: try again

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(2.5)
    # When the server is killed with SIGKILL right as an occurrence falls due, and started again
    time.sleep(1 - time.time() % 1)
    killed_at = time.time() * 1000
    server.kill()
    server.restart()
    time.sleep(3.5)
    stop.set()
    consumer.join(15)
    # (what the killed server had handed out comes back once its visibility timeout ends)
    got.extend(receive_all(server.url, 2 * KILLED_VISIBILITY_MS / 1000))
    # Then every second from the first to the last is stored once (one message id each) and
    # delivered (the one due at the kill and those due while it was down included), none early
    # (a message whose ack was lost in the kill is received again: same id)
    seconds = ids_per_occurrence(got)
    assert set(seconds.values()) == {1}, seconds
    ordered = sorted(seconds)
    assert ordered == list(range(ordered[0], ordered[-1] + 1, 1000))
    assert ordered[0] < killed_at - 1000 and ordered[-1] > killed_at + 2000
    assert all(at >= occurrence_ms(m["message_id"]) for m, at in got)
