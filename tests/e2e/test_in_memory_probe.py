"""``bench/probes/queues_in_memory.py`` (``ontime.py``'s in-memory part) against a real server:
the probe still fits the engine functions it replaces, and what the bench counts with it holds
(every message once, none early, acks answered as the server answers them, with and without
the next receive)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx

PROBE = Path(__file__).resolve().parents[2] / "bench" / "probes" / "queues_in_memory.py"


def test_the_in_memory_probe_delivers_each_message_once_never_early_and_takes_acks(
    make_server,
) -> None:
    # Given a server whose local queues the probe keeps in memory, and 20 messages due soon
    server = make_server(program=[sys.executable, str(PROBE)])
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        batch = [{"destination": "q", "body": f"m{i}", "delay_ms": 300} for i in range(20)]
        sent = client.post("/v1/messages/batch", json={"messages": batch})
        sent.raise_for_status()
        due = {r["id"]: r["deliver_at"] for r in sent.json()["results"]}

        # When a consumer long-polls 7 at a time, acking each batch with its next receive
        got: list[dict] = []
        acking: list[str] | None = None
        deadline = time.monotonic() + 20
        while len(got) < len(batch) and time.monotonic() < deadline:
            ask: dict = {"max": 7, "wait_ms": 2000}
            if acking is not None:
                ask["ack"] = acking
            answer = client.post("/v1/queues/q/receive", json=ask)
            received_at = time.time() * 1000
            assert answer.status_code == 200, answer.text
            body = answer.json()
            if acking is not None:
                assert (body["acked"], body["unknown"]) == (len(acking), [])
            for message in body["messages"]:
                assert received_at >= due[message["id"]], "delivered before its due time"
            got += body["messages"]
            acking = [m["receipt"] for m in body["messages"]]

        # Then each message came once, with its body, from the probe's memory (its receipts
        # are its own: a probe not in force would measure the queue database instead), and an
        # ack on its own is answered too
        assert all(m["receipt"].startswith("p") for m in got)
        assert sorted(m["id"] for m in got) == sorted(due)
        assert sorted(m["body"] for m in got) == sorted(item["body"] for item in batch)
        assert acking
        acked = client.post("/v1/queues/q/ack", json={"receipts": acking}).json()
        assert acked == {"acked": len(acking), "unknown": []}
        again = client.post("/v1/queues/q/ack", json={"receipts": acking}).json()
        assert again == {"acked": 0, "unknown": acking}
        empty = client.post("/v1/queues/q/receive", json={"max": 10}).json()
        assert empty["messages"] == []


def test_with_retain_the_probe_writes_each_acked_message_to_the_queue_database(
    make_server,
) -> None:
    # Given the probe with finished rows kept (ontime.py's in-memory-retained part), and 30
    # messages due soon, received and acked
    server = make_server(program=[sys.executable, str(PROBE)], env={"TARRY_PROBE_RETAIN": "1"})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        batch = [{"destination": "q", "body": f"m{i}", "delay_ms": 200} for i in range(30)]
        sent = client.post("/v1/messages/batch", json={"messages": batch})
        sent.raise_for_status()
        ids = [r["id"] for r in sent.json()["results"]]
        got: list[dict] = []
        deadline = time.monotonic() + 20
        while len(got) < len(ids) and time.monotonic() < deadline:
            answer = client.post("/v1/queues/q/receive", json={"max": 11, "wait_ms": 2000})
            taken = answer.json()["messages"]
            acked = client.post(
                "/v1/queues/q/ack", json={"receipts": [m["receipt"] for m in taken]}
            )
            assert acked.json() == {"acked": len(taken), "unknown": []}
            got += taken
        assert sorted(m["id"] for m in got) == sorted(ids)

        # When the probe's next write of finished rows has had time to run
        # Then the server reads each message back from the queue database, acked, as a
        # finished message of that queue
        deadline = time.monotonic() + 10
        states: dict[str, object] = {}
        while time.monotonic() < deadline:
            states = {i: client.get(f"/v1/messages/{i}").json().get("state") for i in ids}
            if set(states.values()) == {"acked"}:
                break
            time.sleep(0.2)
        assert set(states.values()) == {"acked"}, states
        shown = client.get(f"/v1/messages/{ids[0]}").json()
        assert (shown["queue"], shown["destination"]) == ("q", "q")
