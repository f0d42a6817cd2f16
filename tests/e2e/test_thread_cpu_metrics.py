"""Against a real `tarry serve`: /metrics shows its CPU time by thread (README, "Using more than
one core"), the event loop apart from the queue database and the log store's writer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import ServerProcess
from tests.e2e.test_write_path_metrics import samples

LOOP = 'tarry_thread_cpu_seconds_total{thread="MainThread"}'
QUEUE_DB = 'tarry_thread_cpu_seconds_total{thread="tarry-db_0"}'


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_servers_cpu_is_shown_by_thread(
    make_server: Callable[..., ServerProcess],
) -> None:
    # Given a log store server that took sends and released them into a queue that was read
    server = make_server('[store]\nengine = "log"\n')
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        for _ in range(20):
            batch = [{"destination": "q", "body": "x" * 100} for _ in range(1000)]
            client.post("/v1/messages/batch", json={"messages": batch}).raise_for_status()
        received = 0
        while received < 20_000:
            got = client.post("/v1/queues/q/receive", json={"max": 1000, "wait_ms": 2000})
            messages = got.raise_for_status().json()["messages"]
            assert messages
            received += len(messages)
            receipts = [m["receipt"] for m in messages]
            client.post("/v1/queues/q/ack", json={"receipts": receipts}).raise_for_status()
    # When /metrics is read
    threads = {k: v for k, v in samples(server.url).items() if "tarry_thread_cpu" in k}
    # Then the event loop and the queue database's thread each show their CPU, and the parts
    # add up to the process's own figure
    assert threads[LOOP] > 0
    assert threads[QUEUE_DB] > 0
    assert 'tarry_thread_cpu_seconds_total{thread="other"}' in threads
    assert server.process is not None
    total = _process_cpu_s(server.process.pid)
    assert sum(threads.values()) <= total + 0.05
    assert sum(threads.values()) >= total - 0.2
