"""The online sink's sender without a JVM, against a real ``tarry serve``: input rows in (it runs
the rules itself), several posts in flight, outcomes out in input order; repeats dropped and
reported, rows the rules or the server refuse reported with their code, the rows counted by
verdict, a rerun stores nothing twice. The Spark
path runs end to end in test_import.py."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pyarrow as pa

from tarry.client import Client
from tarry.errors import InvalidArgument
from tarry.model.time import SystemClock
from tarry.pipeline.catalog import views_from_server, views_to_json
from tarry.pipeline.dedupe import Repeats
from tarry.pipeline.screen import DUPLICATE_ROW, REJECT, VERDICTS
from tarry.pipeline.sink_http import COUNT, REFUSED, SPAN, SinkSettings, sender
from tarry.pipeline.validation import ImportRules

HOUR = 3_600_000
SCHEMA = pa.schema(
    [("_row", pa.int64()), ("destination", pa.string()), ("body", pa.string())]
    + [("delay_ms", pa.int64()), ("ttl_ms", pa.int64()), ("message_id", pa.string())]
)


def _setup(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        http.put("/v1/queues/q").raise_for_status()
        http.put("/v1/queues/one", json={"max_length": 1, "overflow": "reject_publish"})
        http.put("/v1/topics/t").raise_for_status()
        for queue in ("s1", "s2"):
            http.put(f"/v1/queues/{queue}").raise_for_status()
            http.put(f"/v1/topics/t/subscriptions/{queue}").raise_for_status()
        http.post("/v1/messages", json={"destination": "one", "body": "fills"}).raise_for_status()


def _batches() -> list[pa.RecordBatch]:
    rows = [
        {"destination": "q", "delay_ms": HOUR, "message_id": "a", "body": "first"},
        {"destination": "t", "delay_ms": 3 * HOUR, "message_id": "b"},
        {"destination": "one", "delay_ms": 1_000, "message_id": "c"},  # destination_full
        {"destination": "q", "delay_ms": 10_000, "ttl_ms": 5, "message_id": "d"},  # rules refuse
        {"destination": "q", "delay_ms": 2 * HOUR, "message_id": "a", "body": "again"},  # repeat
        {"destination": "q", "delay_ms": HOUR, "message_id": "e"},
        {"destination": "q", "delay_ms": HOUR, "message_id": "f"},
        {"destination": "q", "delay_ms": HOUR, "message_id": "g"},
    ]
    table = pa.Table.from_pylist([{"_row": i, **r} for i, r in enumerate(rows)], schema=SCHEMA)
    return table.to_batches(max_chunksize=5)


def _send(url: str, rules: ImportRules) -> dict[str, list[dict[str, Any]]]:
    # batches of 2 with 2 in flight: more posts than in flight, and a batch split in several
    settings = SinkSettings(url=url, batch_size=2, in_flight=2, max_attempts=2, backoff_base_ms=5)
    repeats = Repeats(np.array([4], np.int64), np.array([0], np.int64))
    out = pa.Table.from_batches(list(sender(settings, rules, lambda: repeats)(iter(_batches()))))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in out.to_pylist():
        by_kind.setdefault(row["kind"], []).append(row)
    return by_kind


def _totals(counts: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for row in counts:
        rows, copies = totals.get(row["code"], (0, 0))
        totals[row["code"]] = (rows + row["rows"], copies + row["copies"])
    return totals


def test_sender_posts_first_rows_reports_the_rest_and_a_rerun_stores_nothing_twice(
    server: Any,
) -> None:
    # Given a real server with a queue, a topic of two subscribers and a full queue
    _setup(server.url)
    with Client(server.url) as client:
        views = views_to_json(views_from_server(client, ["q", "t", "one"]))
    now_ms = SystemClock().now_ms()
    rules = ImportRules(now_ms=now_ms, views=tuple(views))

    # When the sender runs over the rows
    first = _send(server.url, rules)

    # Then the accepted first rows are stored (b fans out to two copies) ...
    assert _totals(first[COUNT]) == {"created": (5, 6)}
    assert sorted(r["partition"] for r in first[SPAN]) == sorted(
        {(now_ms + h * HOUR) // HOUR * HOUR for h in (1, 3)}
    )
    # ... the full queue's row comes back, after its retry, as a reject with its record ...
    [refused] = first[REFUSED]
    assert (refused["_row"], refused["code"], refused["rows"]) == (2, "destination_full", 1)
    assert refused["message_id"] == "c" and '"message_id":"c"' in refused["record"]
    # ... the repeat as a duplicate naming the kept row, the row the rules refuse as a reject ...
    [repeat] = first[DUPLICATE_ROW]
    assert repeat["_row"] == 4 and "repeats input row 0" in repeat["message"]
    assert '"body":"again"' in repeat["record"]
    [rejected] = first[REJECT]
    assert (rejected["_row"], rejected["code"]) == (3, "expiry_error")
    assert '"message_id":"d"' in rejected["record"]
    # ... and every row is counted by the rules' verdict (the repeat and the full one passed)
    verdicts: dict[str | None, int] = {}
    for row in first[VERDICTS]:
        verdicts[row["code"]] = verdicts.get(row["code"], 0) + row["rows"]
    assert verdicts == {None: 7, "expiry_error": 1}
    assert set(first) == {COUNT, SPAN, REFUSED, DUPLICATE_ROW, REJECT, VERDICTS}
    with httpx.Client(base_url=server.url) as http:
        [a] = http.get("/v1/messages", params={"message_id": "a"}).json()["items"]
        assert a["size"] == len("first")
        assert http.get("/v1/stats").json()["messages"]["scheduled"] == 6

        # When it runs again, Then the server holds every message already
        again = _send(server.url, rules)
        assert _totals(again[COUNT]) == {"already_there": (5, 6)}
        assert http.get("/v1/stats").json()["messages"]["scheduled"] == 6


def test_sender_sends_in_parts_that_fit_a_server_with_a_smaller_max_batch(
    make_server: Any,
) -> None:
    # Given a server that takes at most 3 messages a post, and a sink set to post 5
    server = make_server("[server]\nmax_batch = 3\n")
    _setup(server.url)
    with Client(server.url) as client:
        views = views_to_json(views_from_server(client, ["q", "t", "one"]))
    rules = ImportRules(now_ms=SystemClock().now_ms(), views=tuple(views))
    settings = SinkSettings(url=server.url, batch_size=5, in_flight=2, max_attempts=2)
    repeats = Repeats(np.array([4], np.int64), np.array([0], np.int64))

    # When the sender runs, Then every row is imported as with a server that takes 5
    out = pa.Table.from_batches(list(sender(settings, rules, lambda: repeats)(iter(_batches()))))
    rows = out.to_pylist()
    assert _totals([r for r in rows if r["kind"] == COUNT]) == {"created": (5, 6)}
    [refused] = [r for r in rows if r["kind"] == REFUSED]
    assert refused["code"] == "destination_full"  # not "a batch holds at most 3 messages"


def test_a_refused_batch_tells_its_limit_to_the_client(make_server: Any) -> None:
    server = make_server("[server]\nmax_batch = 3\n")
    _setup(server.url)
    with Client(server.url) as client:
        try:
            client.send_batch([{"destination": "q", "body": str(i)} for i in range(4)])
        except InvalidArgument as exc:
            assert exc.details == {"max_batch": 3} and "at most 3" in exc.message
        else:
            raise AssertionError("a batch over max_batch was accepted")
