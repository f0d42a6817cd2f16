"""Two real `tarry serve` nodes on one real PostgreSQL database run the same schedule: each
occurrence is delivered exactly once while the top-ups move between them and one is killed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_schedules import ids_per_occurrence, occurrence_ms, receive_all

pytestmark = pytest.mark.postgres


VISIBILITY_MS = 1500


def test_two_postgres_nodes_running_one_schedule_deliver_each_occurrence_once(
    make_server: Callable[..., ServerProcess], pg_dsn: str
) -> None:
    import psycopg  # the postgres extra

    # Given two real nodes on one PostgreSQL database with a short lease, so that the top-ups
    # move between them, and the same schedule put on both
    config = f"""
[store]
engine = "postgres"
dsn = "{pg_dsn}"
[journal]
enabled = false
[dispatch]
lease_ms = 2000
[schedules]
horizon_ms = 2000
interval_ms = 100
lease_ms = 400
[queues.q]
"""
    one, two = make_server(config), make_server(config)
    for node in (one, two):
        httpx.put(
            f"{node.url}/v1/schedules/tick", json={"cron": "* * * * * *", "destination": "q"}
        ).raise_for_status()
    got: list[tuple[dict, float]] = []
    owners: set[str] = set()
    stop = threading.Event()

    def consume(node: ServerProcess) -> None:
        while not stop.is_set():
            try:
                # A short visibility: a message a killed node handed out (its answer or its
                # ack lost with the node) comes back to the other node within the test.
                got.extend(receive_all(node.url, 0.5, visibility_ms=VISIBILITY_MS))
            except (httpx.HTTPError, KeyError, ValueError):
                time.sleep(0.1)

    def watch() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute("SELECT owner FROM schedules WHERE name = 'tick'").fetchone()
                if row and row[0]:
                    owners.add(row[0])
                time.sleep(0.05)

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in (one, two)]
    threads.append(threading.Thread(target=watch, daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(3)
    # When one node is killed and started again while both run the schedule
    one.kill()
    time.sleep(1.5)
    one.restart()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(15)
    # (what the killed node had handed out comes back once its visibility timeout ends)
    got.extend(receive_all(two.url, 2 * VISIBILITY_MS / 1000, visibility_ms=VISIBILITY_MS))
    # Then every second was stored exactly once (one message id each), across both nodes,
    # and delivered (a message whose ack died with its node is received again: same id)
    seconds = ids_per_occurrence(got)
    assert set(seconds.values()) == {1}, seconds
    ordered = sorted(seconds)
    assert ordered == list(range(ordered[0], ordered[-1] + 1, 1000))
    assert len(ordered) >= 6
    assert all(at >= occurrence_ms(m["message_id"]) for m, at in got)
    # and more than one node topped it up
    assert len(owners) >= 2, owners
