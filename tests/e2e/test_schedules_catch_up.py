"""A real `tarry serve` stopped for a while: the occurrences of its schedule that fell meanwhile
are dropped (``catch_up: "skip"``) or delivered once (``"once"``), and the schedule goes on."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_schedules import occurrence_ms, receive_all

#: Stored 0.5 s ahead; an occurrence over 1 s late when the node starts is missed.
CONFIG = """
[journal]
enabled = false
[schedules]
horizon_ms = 500
interval_ms = 100
late_after_ms = 1000
[queues.q]
"""


@pytest.mark.parametrize("policy", ["skip", "once"])
def test_occurrences_missed_while_stopped_are_skipped_or_delivered_once(
    make_server: Callable[..., ServerProcess], policy: str
) -> None:
    # Given a schedule every second and a consumer
    server = make_server(CONFIG)
    httpx.put(
        f"{server.url}/v1/schedules/tick",
        json={"cron": "* * * * * *", "destination": "q", "catch_up": policy},
    ).raise_for_status()
    got: list[tuple[dict, float]] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            try:
                got.extend(receive_all(server.url, 0.5))
            except (httpx.HTTPError, KeyError, ValueError):
                time.sleep(0.1)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(2)
    # When the server stops for five seconds
    stopped_at = time.time() * 1000
    server.stop()
    time.sleep(5)
    started_at = time.time() * 1000
    server.start()
    time.sleep(2.5)
    stop.set()
    consumer.join(15)

    # Then (past the occurrences stored before the stop) what fell while it was down is not
    # delivered, except, with "once", one of them: sent when the node came back, so due over
    # a second after its own time (a regular occurrence is due at its time, or a little after)
    seconds = Counter(occurrence_ms(m["message_id"]) for m, _ in got)
    assert set(seconds.values()) == {1}, seconds
    after_stop = [(occurrence_ms(m["message_id"]), m) for m, _ in got]
    after_stop = [(at, m) for at, m in after_stop if at > stopped_at + 2000]
    caught_up = [at for at, m in after_stop if m["deliver_at"] - at >= 1000]
    # (one less than a second late when the node came back is stored then, due at once)
    regular = sorted(at for at, m in after_stop if m["deliver_at"] - at < 1000)
    assert len(caught_up) == (1 if policy == "once" else 0)
    # and nothing that fell well inside the downtime came as a regular occurrence
    assert [at for at in regular if at <= started_at - 1000] == []
    # and the schedule went on: every second since the node came back, once
    assert len(regular) >= 2 and regular == list(range(regular[0], regular[-1] + 1, 1000))
    if caught_up:
        assert caught_up[0] < regular[0]
