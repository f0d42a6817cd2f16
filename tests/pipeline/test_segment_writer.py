"""The offline sink's writer without a JVM: input rows in (it runs the rules itself), segment
files out, read back with the store's own codec as the messages ``fan_out`` makes; repeats
dropped and reported; every file sorted by due time. The Spark path and the store's adoption
run end to end in test_offline_sink.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from tarry.model.fanout import fan_out
from tarry.model.message import Message, SendPlan
from tarry.model.validate import DestinationView, TargetView, parse_send
from tarry.pipeline.catalog import views_to_json
from tarry.pipeline.dedupe import Repeats
from tarry.pipeline.screen import DUPLICATE_ROW, REJECT, VERDICTS
from tarry.pipeline.sink_log import FILE, LogSinkSettings, import_writer
from tarry.pipeline.validation import ImportRules
from tarry.store.log.held import dedupe_hash
from tarry.store.log.layout import Layout
from tarry.store.log.record import Record, decode_message, scan

NOW = 1_800_000_000_000
G = 300_000
VIEWS = {
    "q": DestinationView("q", "queue", (TargetView("q"),)),
    "t": DestinationView("t", "topic", (TargetView("s1"), TargetView("s2"))),
    "lonely": DestinationView("lonely", "topic", ()),
}


NO_REPEATS = Repeats(np.zeros(0, np.int64), np.zeros(0, np.int64))
RULES = ImportRules(now_ms=NOW, views=tuple(views_to_json(VIEWS)), partition_ms=G)


def _input(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    schema = pa.schema(
        [("_row", pa.int64()), ("destination", pa.string()), ("body", pa.string())]
        + [("delay_ms", pa.int64()), ("ttl_ms", pa.int64()), ("message_id", pa.string())]
        + [("headers", pa.string()), ("correlation_id", pa.string())]
    )
    return pa.RecordBatch.from_pylist([{"_row": i, **r} for i, r in enumerate(rows)], schema=schema)


def _written(
    settings: LogSinkSettings, batches: list[pa.RecordBatch], repeats: Repeats = NO_REPEATS
) -> list[dict[str, Any]]:
    out = import_writer(settings, RULES, lambda: repeats)(iter(batches))
    return pa.Table.from_batches(list(out)).to_pylist()


def _records(settings: LogSinkSettings, report: dict[str, Any]) -> list[Record]:
    data = (settings.area / report["name"]).read_bytes()
    assert len(data) == report["bytes"]
    records = [r for r in scan(data) if isinstance(r, Record)]
    assert len(records) == report["records"]
    return records


def _expected(row: dict[str, Any]) -> list[Message]:
    data = {k: v for k, v in row.items() if v is not None}
    if "headers" in data:
        data["headers"] = orjson.loads(data["headers"])
    request = parse_send(data)
    plan = SendPlan(
        request=request,
        sent_at_ms=NOW,
        deliver_at_ms=NOW + (request.delay_ms or 0),
        expires_at_ms=None if request.ttl_ms is None else NOW + request.ttl_ms,
    )
    return fan_out(plan, VIEWS[request.destination], lambda _s, _d: "")


def test_writer_files_hold_the_fanned_out_messages(tmp_path: Path) -> None:
    # Given accepted rows for a queue, a topic, and a topic nobody subscribes to
    rows = [
        {"destination": "q", "delay_ms": 1_000, "message_id": "a", "body": "one"},
        {"destination": "t", "delay_ms": 2 * G, "message_id": "b", "headers": '{"k": "v"}'},
        {"destination": "lonely", "delay_ms": 5, "message_id": "c"},
        {"destination": "q", "delay_ms": 2 * G + 1, "message_id": 'd"\\', "ttl_ms": 10 * G},
        {"destination": "q", "delay_ms": 3 * G, "message_id": "e", "correlation_id": "c1"},
    ]
    settings = LogSinkSettings(area=tmp_path / "area", granularity_ms=G, now_ms=NOW)
    # When the writer runs over them (in two batches, as Spark may hand them over)
    batch = _input(rows)
    written = _written(settings, [batch.slice(0, 2), batch.slice(2)])
    # Then one file per time partition, whose reports match the files
    files = [w for w in written if w["kind"] == FILE]
    # (the store's own partitions, ``layout.py``: these near ones are its finest)
    assert sorted(f["partition"] for f in files) == [
        Layout.level0(n) for n in (NOW // G, NOW // G + 2, NOW // G + 3)
    ]
    got: list[tuple[Message, int]] = []
    for report in sorted(files, key=lambda f: f["partition"]):
        got += [decode_message(r.payload) for r in _records(settings, report)]
    # And the records are the messages fan_out builds (ids aside), with the engine's hashes
    expected = [m for r in sorted(rows, key=lambda r: r["delay_ms"]) for m in _expected(r)]
    assert len(got) == len(expected) == 5  # the topic without subscribers has no copy
    for (message, key), want in zip(got, expected, strict=True):
        assert key == dedupe_hash(want)
        want.id = message.id
        assert message.deliver_at_ms // G == want.deliver_at_ms // G
        assert (message.destination, message.topic, message.body) == (
            want.destination,
            want.topic,
            want.body,
        )
        assert (message.headers, message.message_id, message.correlation_id) == (
            want.headers,
            want.message_id,
            want.correlation_id,
        )
        assert (message.deliver_at_ms, message.expires_at_ms) == (
            want.deliver_at_ms,
            want.expires_at_ms,
        )


def test_writer_drops_repeats_and_rejects_and_sorts_each_file(tmp_path: Path) -> None:
    # Given rows out of due order, a rejected row, and repeats of rows 0 and 1 (found beforehand)
    rows = [
        {"destination": "q", "delay_ms": 9_000, "message_id": "a"},
        {"destination": "q", "delay_ms": 5_000, "message_id": "b"},
        {"destination": "nowhere", "delay_ms": 1, "message_id": "x"},
        {"destination": "q", "delay_ms": 1_000, "message_id": "a", "body": "again"},
        {"destination": "q", "delay_ms": 7_000, "message_id": "c"},
        {"destination": "q", "delay_ms": 3_000, "message_id": "b"},
        {"destination": "q", "delay_ms": 2_000, "message_id": "d"},
    ]
    repeats = Repeats(np.array([3, 5], np.int64), np.array([0, 1], np.int64))
    # and a writer that flushes after every batch (so a partition gets several files)
    settings = LogSinkSettings(area=tmp_path / "area", granularity_ms=G, now_ms=NOW, flush_bytes=1)
    batch = _input(rows)
    written = _written(settings, [batch.slice(0, 4), batch.slice(4)], repeats)
    # Then the repeats come out as duplicate rejects naming the kept row, with their record
    duplicates = sorted((w for w in written if w["kind"] == DUPLICATE_ROW), key=lambda w: w["_row"])
    assert [(d["_row"], d["code"], d["message_id"]) for d in duplicates] == [
        (3, "duplicate", "a"),
        (5, "duplicate", "b"),
    ]
    assert "repeats input row 0" in duplicates[0]["message"]
    assert orjson.loads(duplicates[0]["record"])["body"] == "again"
    # And the row the rules refuse as a reject with its record; every row counted by verdict
    [rejected] = [w for w in written if w["kind"] == REJECT]
    assert (rejected["_row"], rejected["message_id"]) == (2, "x") and rejected["record"]
    counted = {w["code"]: w["records"] for w in written if w["kind"] == VERDICTS}
    assert counted == {None: 6, "unknown_destination": 1} and rejected["code"] in counted
    # And the files hold the kept rows once (no rejected row, no repeat), each sorted by due time
    files = [w for w in written if w["kind"] == FILE]
    assert len(files) == 2 and {f["partition"] for f in files} == {Layout.level0(NOW // G)}
    ids = []
    for report in files:
        messages = [decode_message(r.payload)[0] for r in _records(settings, report)]
        due = [m.deliver_at_ms for m in messages]
        assert due == sorted(due)
        ids += [m.message_id for m in messages]
    assert sorted(ids) == ["a", "b", "c", "d"]
