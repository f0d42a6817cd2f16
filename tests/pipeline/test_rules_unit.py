"""The import's pieces that need no JVM: row decoding, the rules over one Arrow batch (every
code the catalog snapshot can decide), the mapping option, the sink's retry loop, chart scales.
The same paths run end to end through Spark and a real server in test_import.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.errors import InvalidArgument, Overloaded, Unavailable
from tarry.model.validate import DestinationView, TargetView
from tarry.pipeline.catalog import views_from_json, views_to_json
from tarry.pipeline.records import decode_row, derived_message_id, record_json
from tarry.pipeline.sink_http import SinkSettings, send_all
from tarry.pipeline.sources import parse_mapping
from tarry.pipeline.svg import nice_max
from tarry.pipeline.validation import ImportRules, check_batch, checker

NOW = 1_800_000_000_000
VIEWS = {
    "q": DestinationView("q", "queue", (TargetView("q"),)),
    "off": DestinationView("off", "queue", (TargetView("off", put_enabled=False),)),
    "tiny": DestinationView("tiny", "queue", (TargetView("tiny", max_message_bytes=4),)),
    "t": DestinationView("t", "topic", (TargetView("s1"), TargetView("s2"))),
}


def _check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules = ImportRules(now_ms=NOW, views=tuple(views_to_json(VIEWS)), partition_ms=3_600_000)
    columns = ["destination", "body", "delay_ms", "deliver_at", "ttl_ms", "message_id"]
    columns += ["group_id", "headers"]
    table = {"_row": list(range(len(rows)))}
    table.update({c: [r.get(c) for r in rows] for c in columns})
    schema = pa.schema(
        [("_row", pa.int64()), ("destination", pa.string()), ("body", pa.string())]
        + [("delay_ms", pa.string()), ("deliver_at", pa.string()), ("ttl_ms", pa.int64())]
        + [("message_id", pa.string()), ("group_id", pa.string()), ("headers", pa.string())]
    )
    batch = pa.RecordBatch.from_pydict(table, schema=schema)
    return [r for out in checker(rules)(iter([batch])) for r in out.to_pylist()]


def test_every_code_the_snapshot_decides() -> None:
    out = _check(
        [
            {"destination": "q", "delay_ms": "60000", "message_id": "a"},
            {"destination": "nowhere"},
            {"destination": "off"},
            {"destination": "tiny", "body": "too long"},
            {"destination": "q", "delay_ms": "5", "deliver_at": "2030-01-01T00:00:00Z"},
            {"destination": "q", "delay_ms": "10000", "ttl_ms": 10},
            {"destination": "q", "delay_ms": "10", "group_id": "g"},
            {"destination": "q", "headers": "{not json"},
            {"destination": "t", "deliver_at": "2027-01-01T00:00:00Z"},
        ]
    )
    assert [r["code"] for r in out] == [
        None,
        "unknown_destination",
        "put_disabled",
        "message_too_large",
        "invalid_argument",
        "expiry_error",
        "options_error",
        "invalid_argument",
        None,
    ]
    assert out[0]["deliver_at_ms"] == NOW + 60_000
    assert out[0]["partition_ms"] == NOW  # NOW is a whole hour
    assert out[0]["targets"] == ["q"]
    assert out[8]["targets"] == ["s1", "s2"]
    assert out[8]["deliver_at_ms"] == NOW  # a past deliver_at means now
    assert "ttl_ms (10) is shorter" in out[5]["message"]
    assert out[7]["message"].startswith("headers is not valid JSON")
    assert all(r["message_id"] for r in out)  # derived where missing


def test_decoding_and_derived_ids() -> None:
    row = {"destination": "q", "delay_ms": "5", "retain": "false", "body": b"\xff\x00"}
    data = decode_row({**row, "headers": '{"k": "v"}', "ttl_ms": 7.0, "message_id": None})
    assert data == {
        "destination": "q",
        "delay_ms": 5,
        "retain": False,
        "body_base64": "/wA=",
        "headers": {"k": "v"},
        "ttl_ms": 7,
    }
    assert decode_row({"headers": [("a", "b")]})["headers"] == {"a": "b"}
    assert derived_message_id(data) == derived_message_id(dict(data))
    assert derived_message_id(data) != derived_message_id({**data, "delay_ms": 6})
    assert derived_message_id(data).startswith("imp-")


def test_catalog_round_trip() -> None:
    assert views_from_json(views_to_json(VIEWS)) == VIEWS


def test_mapping_option() -> None:
    assert parse_mapping(["deliver_at=send_time, destination=channel", "body=text"]) == {
        "deliver_at": "send_time",
        "destination": "channel",
        "body": "text",
    }
    for bad in (["deliver_at"], ["when=send_time"], ["body=a,body=b"]):
        with pytest.raises(InvalidArgument):
            parse_mapping(bad)


def test_sink_retries_only_what_may_succeed_later() -> None:
    answers: list[Any] = [
        Unavailable("down"),
        [
            {"id": "1"},
            {"error": {"code": "destination_full", "message": "full"}},
            {"error": {"code": "not_authorized", "message": "no"}},
        ],
        [{"error": {"code": "destination_full", "message": "full"}}],
        [{"id": "2", "duplicate": True}],
    ]
    sent: list[list[str]] = []
    slept: list[float] = []

    def post(records: pa.Array) -> list[dict[str, Any]]:
        sent.append(records.to_pylist())
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    settings = SinkSettings(url="http://x", max_attempts=5, backoff_base_ms=100)
    outcomes = send_all(pa.array(["a", "b", "c"]), post, settings, slept.append)
    assert [o for o, _ in outcomes] == ["created", "already_there", "not_authorized"]
    assert sent == [["a", "b", "c"], ["a", "b", "c"], ["b"], ["b"]]
    assert len(slept) == 3 and 0.07 <= slept[0] <= 0.13 and slept[2] > slept[0]


def test_sink_retries_a_send_refused_because_its_queue_is_behind() -> None:
    behind = {"code": "overloaded", "message": "behind", "retry_after_s": 1}
    answers: list[Any] = [[{"id": "1"}, {"error": behind}], [{"id": "2"}]]
    sent: list[list[str]] = []

    def post(records: pa.Array) -> list[dict[str, Any]]:
        sent.append(records.to_pylist())
        return answers.pop(0)  # type: ignore[no-any-return]

    outcomes = send_all(
        pa.array(["a", "b"]), post, SinkSettings(url="x", max_attempts=3), lambda s: None
    )
    assert [o for o, _ in outcomes] == ["created", "created"]
    assert sent == [["a", "b"], ["b"]]


def test_sink_gives_up_after_the_last_attempt() -> None:
    def post(records: pa.Array) -> list[dict[str, Any]]:
        return [{"error": {"code": "destination_full", "message": "full"}} for _ in records]

    outcomes = send_all(
        pa.array(["a"]), post, SinkSettings(url="x", max_attempts=3), lambda s: None
    )
    assert outcomes == [("destination_full", "full")]


def test_chart_scale() -> None:
    assert [nice_max(v) for v in (0, 0.3, 1, 7, 12, 99, 101, 4500)] == [
        1,
        0.5,
        1,
        10,
        20,
        100,
        200,
        5000,
    ]


_TEXTS = st.one_of(st.none(), st.text(max_size=6), st.sampled_from(['a"b', "a\\b", "é\n", "\x7f"]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "destination": st.one_of(st.none(), st.sampled_from(["q", "t", "bad name"])),
                "body": _TEXTS,
                "delay_ms": st.one_of(st.none(), st.integers(-3, 10**6)),
                "message_id": _TEXTS,
                "correlation_id": _TEXTS,
            }
        ),
        min_size=1,
        max_size=12,
    )
)
def test_records_built_column_wise_are_the_rows_json(rows: list[dict[str, Any]]) -> None:
    # Given input rows of the common types (some text needing JSON escapes, some ids missing)
    schema = pa.schema(
        [("_row", pa.int64()), ("destination", pa.string()), ("body", pa.string())]
        + [("delay_ms", pa.int64()), ("message_id", pa.string())]
        + [("correlation_id", pa.string())]
    )
    batch = pa.RecordBatch.from_pylist(
        [{"_row": i, **r} for i, r in enumerate(rows)], schema=schema
    )
    rules = ImportRules(now_ms=NOW, views=tuple(views_to_json(VIEWS)))
    # When checked
    out = check_batch(batch, rules, views_from_json(rules.views)).to_pylist()
    # Then each record is the row's canonical JSON, with a derived message_id where none was given
    for row, got in zip(rows, out, strict=True):
        data = decode_row(row)
        data.setdefault("message_id", derived_message_id(data))
        assert got["record"] == record_json(data).decode()
        assert got["message_id"] == data["message_id"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "destination": st.one_of(st.none(), st.sampled_from(["q", "t", "bad name"])),
                "body": _TEXTS,
                "delay_ms": st.one_of(st.none(), st.integers(-3, 10**6)),
                "message_id": _TEXTS,
            }
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_records_only_where_asked_and_for_rejected_rows(
    rows: list[dict[str, Any]], asked: list[bool]
) -> None:
    # Given input rows, and some of them whose record is wanted
    schema = pa.schema(
        [("_row", pa.int64()), ("destination", pa.string()), ("body", pa.string())]
        + [("delay_ms", pa.int64()), ("message_id", pa.string())]
    )
    batch = pa.RecordBatch.from_pylist(
        [{"_row": i, **r} for i, r in enumerate(rows)], schema=schema
    )
    rules = ImportRules(now_ms=NOW, views=tuple(views_to_json(VIEWS)))
    views = views_from_json(rules.views)
    record_for = np.array(asked[: len(rows)])
    # When checked with and without the mask
    every = check_batch(batch, rules, views).to_pylist()
    some = check_batch(batch, rules, views, record_for=record_for).to_pylist()
    # Then only the records differ: the same where asked or rejected, null elsewhere
    for full, part, wanted in zip(every, some, record_for, strict=True):
        keep = wanted or full["code"] is not None
        assert part["record"] == (full["record"] if keep else None)
        assert {k: v for k, v in part.items() if k != "record"} == {
            k: v for k, v in full.items() if k != "record"
        }


def test_sink_waits_out_an_overloaded_server_as_its_retry_after_says() -> None:
    answers: list[Any] = [Overloaded("behind", retry_after_s=3), [{"id": "1"}]]
    slept: list[float] = []

    def post(records: pa.Array) -> list[dict[str, Any]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    settings = SinkSettings(url="http://x", max_attempts=3, backoff_base_ms=100)
    outcomes = send_all(pa.array(["a"]), post, settings, slept.append)
    assert outcomes == [("created", None)]
    assert slept[0] == 3 and len(slept) == 2  # Retry-After, then the back-off
