"""Acking with the next receive against a real ``tarry serve``: the client's ``receive(ack=...)``
and ``tarry consume``, which acks each batch with the receive after it."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from tarry import Client
from tarry.client import ReceivedBatch


def _consume(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "--url", url, "consume", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )


def test_the_client_acks_a_batch_with_the_next_receive(server) -> None:
    with Client(server.url) as tarry:
        tarry.declare_queue("orders")
        sent = [tarry.send("orders", f"order {i}").id for i in range(3)]
        first = tarry.receive("orders", max=2)
        assert isinstance(first, ReceivedBatch) and first.acked is None
        second = tarry.receive("orders", max=10, ack=[m.receipt for m in first] + ["x.1"])
        assert [m.id for m in second] == sent[2:]
        assert (second.acked, second.unknown) == (2, ["x.1"])
        assert [tarry.get(i).state for i in sent] == ["acked", "acked", "delivered"]
        last = tarry.receive("orders", wait="100ms", ack=[m.receipt for m in second])
        assert (list(last), last.acked, last.unknown) == ([], 1, [])
        assert tarry.get(sent[2]).state == "acked"


def test_the_http_answer_adds_acked_and_unknown_only_when_asked(server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        c.put("/v1/queues/q", json={}).raise_for_status()
        c.post("/v1/messages", json={"destination": "q", "body": "x"}).raise_for_status()
        plain = c.post("/v1/queues/q/receive", json={"max": 10}).json()
        assert set(plain) == {"messages"}
        receipt = plain["messages"][0]["receipt"]
        acked = c.post("/v1/queues/q/receive", json={"ack": [receipt, receipt]}).json()
        assert acked == {"messages": [], "acked": 1, "unknown": [receipt]}
        assert c.post("/v1/queues/q/receive", json={"ack": None}).json() == {"messages": []}
        bad = c.post("/v1/queues/q/receive", json={"ack": receipt})
        assert bad.status_code == 400
        assert bad.json()["error"] == {
            "code": "invalid_argument",
            "message": "ack must be a list of receipt strings from receive",
        }


#: No refusal on consumers' lag: a `tarry consume` process slow to start on a busy machine
#: leaves the queue's sampled lag past the limit until the next sample, and this test sends
#: again right after it (overload has tests of its own, test_overload.py).
_NO_OVERLOAD = "[dispatch]\noverload_lag_ms = 0\n"


def test_consume_acks_every_batch_it_printed(make_server) -> None:
    server = make_server(_NO_OVERLOAD)
    with Client(server.url) as tarry:
        tarry.declare_queue("jobs")
        for i in range(2):
            tarry.send("jobs", f"job {i}")
        # Two ready, four asked: the second receive (empty after its wait) acks the first batch.
        done = _consume(server.url, "jobs", "--count", "4", "--wait", "300ms")
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("\tjob ") == 2
        info = tarry.get_queue("jobs")
        assert (info.ready, info.in_flight) == (0, 0)
        # Exactly the count: the last batch is acked on its own.
        for i in range(3):
            tarry.send("jobs", f"job {i}")
        assert _consume(server.url, "jobs", "--count", "3").returncode == 0
        info = tarry.get_queue("jobs")
        assert (info.ready, info.in_flight) == (0, 0)
        # --no-ack leaves them in flight.
        tarry.send("jobs", "kept")
        assert (
            _consume(server.url, "jobs", "--no-ack", "--count", "2", "--wait", "200ms").returncode
            == 0
        )
        assert tarry.get_queue("jobs").in_flight == 1
