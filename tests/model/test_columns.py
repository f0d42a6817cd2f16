"""The send rules column by column (model/columns.py) against one send at a time
(model/validate.py): every code, and agreement on random rows, valid and invalid."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.errors import TarryError
from tarry.model.columns import check_columns
from tarry.model.message import MAX_DELAY_MS
from tarry.model.validate import (
    DestinationView,
    SendLimits,
    TargetView,
    parse_send,
    validate_send,
)

NOW = 1_800_000_000_000
LIMITS = SendLimits(max_message_bytes=64)
VIEWS = {
    "q": DestinationView("q", "queue", (TargetView("q"),)),
    "off": DestinationView("off", "queue", (TargetView("off", put_enabled=False),)),
    "tiny": DestinationView("tiny", "queue", (TargetView("tiny", max_message_bytes=4),)),
    "full": DestinationView("full", "queue", (TargetView("full", full=True),)),
    "t": DestinationView("t", "topic", (TargetView("s1"), TargetView("s2", max_message_bytes=8))),
    "secret": DestinationView("secret", "queue", (TargetView("secret"),)),
}
SCHEMA = pa.schema(
    [
        ("destination", pa.string()),
        ("body", pa.string()),
        ("delay_ms", pa.int64()),
        ("deliver_at", pa.int64()),
        ("ttl_ms", pa.int64()),
        ("message_id", pa.string()),
        ("correlation_id", pa.string()),
        ("group_id", pa.string()),
    ]
)


def _may_send(name: str) -> bool:
    return name != "secret"


def _columns(rows: list[dict[str, Any]], schema: pa.Schema = SCHEMA) -> list[dict[str, Any]]:
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    got = check_columns(batch, now_ms=NOW, views=VIEWS, may_send=_may_send, limits=LIMITS)
    fields = ("code", "message", "deliver_at_ms", "expires_at_ms", "body", "message_id")
    lists = {f: getattr(got, f).to_pylist() for f in fields}
    lists["correlation_id"] = got.correlation_id.to_pylist()
    return [{f: lists[f][i] for f in lists} for i in range(batch.num_rows)]


def _one_at_a_time(row: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in row.items() if v is not None}
    try:
        request = parse_send(data)
        name = request.destination
        plan = validate_send(
            request,
            now_ms=NOW,
            destination=VIEWS.get(name) or DestinationView(name, None),
            may_send=_may_send(name),
            limits=LIMITS,
        )
    except TarryError as exc:
        return dict.fromkeys(("deliver_at_ms", "expires_at_ms", "body", "message_id"), None) | {
            "code": exc.code,
            "message": exc.message,
            "correlation_id": None,
        }
    return {
        "code": None,
        "message": None,
        "deliver_at_ms": plan.deliver_at_ms,
        "expires_at_ms": plan.expires_at_ms,
        "body": request.body,
        "message_id": request.message_id,
        "correlation_id": request.correlation_id,
    }


def test_every_code_column_wise() -> None:
    rows = [
        {"destination": "q", "delay_ms": 60_000, "message_id": "a", "ttl_ms": 0},
        {"destination": None},
        {"destination": "bad name!"},
        {"destination": "q", "delay_ms": -1},
        {"destination": "q", "delay_ms": 5, "deliver_at": NOW},
        {"destination": "q", "deliver_at": -5},
        {"destination": "q", "ttl_ms": -2},
        {"destination": "q", "message_id": ""},
        {"destination": "q", "correlation_id": "x" * 257},
        {"destination": "q", "group_id": "a\x00b"},
        {"destination": "q", "delay_ms": 10, "group_id": "g"},
        {"destination": "q", "delay_ms": MAX_DELAY_MS + 1},
        {"destination": "q", "delay_ms": 10_000, "ttl_ms": 10},
        {"destination": "secret"},
        {"destination": "nowhere"},
        {"destination": "off"},
        {"destination": "q", "body": "x" * 65},
        {"destination": "tiny", "body": "too long"},
        {"destination": "full"},
        {"destination": "t", "deliver_at": NOW - 5, "body": "ok"},
    ]
    got = _columns(rows)
    assert [r["code"] for r in got] == [
        None,
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "invalid_argument",
        "options_error",
        "invalid_argument",
        "expiry_error",
        "not_authorized",
        "unknown_destination",
        "put_disabled",
        "message_too_large",
        "message_too_large",
        "destination_full",
        None,
    ]
    assert got == [_one_at_a_time(r) for r in rows]
    assert got[0]["deliver_at_ms"] == NOW + 60_000 == got[0]["expires_at_ms"]  # TTL 0: on arrival
    assert got[19]["deliver_at_ms"] == NOW  # a past deliver_at means now
    assert "ttl_ms (10) is shorter" in got[12]["message"]


def test_rows_the_columns_cannot_decide_go_one_at_a_time() -> None:
    # Given columns outside the common set, or of an unusual Arrow type
    schema = pa.schema(
        [
            ("destination", pa.string()),
            ("delay_ms", pa.string()),
            ("headers", pa.string()),
            ("reply_to", pa.string()),
        ]
    )
    rows = [
        {"destination": "q", "delay_ms": None},
        {"destination": "q", "delay_ms": "60000"},
        {"destination": "q", "headers": "{}"},
        {"destination": "q", "reply_to": "q"},
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    # When checked
    got = check_columns(batch, now_ms=NOW, views=VIEWS)
    # Then only those rows went one at a time, with the same verdicts
    assert got.by_row.tolist() == [False, True, True, True]
    assert got.code.to_pylist() == [None, "invalid_argument", "invalid_argument", None]
    assert got.message.to_pylist()[1] == _one_at_a_time(rows[1])["message"]
    assert got.reply_to.to_pylist() == [None, None, None, "q"]


_NAMES = st.sampled_from(
    ["q", "off", "tiny", "full", "t", "secret", "nowhere", "bad name", "", None]
)
_INTS = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.integers(-(10**9), 10**12),
    st.integers(MAX_DELAY_MS - 2, MAX_DELAY_MS + 2),
    st.integers(NOW - 10**6, NOW + 10**6),
)
_IDS = st.one_of(
    st.none(),
    st.text(max_size=4),
    st.just(""),
    st.just("a\x00"),
    st.text(min_size=255, max_size=258, alphabet="ab"),
)
_ROWS = st.fixed_dictionaries(
    {
        "destination": _NAMES,
        "body": st.one_of(st.none(), st.text(max_size=80)),
        "delay_ms": _INTS,
        "deliver_at": _INTS,
        "ttl_ms": _INTS,
        "message_id": _IDS,
        "correlation_id": _IDS,
        "group_id": st.one_of(st.none(), st.just("g"), st.just("")),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ROWS, min_size=1, max_size=20))
def test_columns_agree_with_one_send_at_a_time(rows: list[dict[str, Any]]) -> None:
    assert _columns(rows) == [_one_at_a_time(r) for r in rows]


_ODD = pa.schema(
    [
        ("destination", pa.string()),
        ("delay_ms", pa.string()),
        ("ttl_ms", pa.float64()),
        ("retain", pa.bool_()),
        ("report", pa.string()),
        ("message_id", pa.int64()),
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "destination": _NAMES,
                "delay_ms": st.one_of(st.none(), st.sampled_from(["5", "x", "-1"])),
                "ttl_ms": st.one_of(st.none(), st.sampled_from([0.0, 2.5, 10.0])),
                "retain": st.one_of(st.none(), st.booleans()),
                "report": st.one_of(st.none(), st.sampled_from(["expiration", "nope"])),
                "message_id": st.one_of(st.none(), st.integers(0, 3)),
            }
        ),
        min_size=1,
        max_size=10,
    )
)
def test_unusual_columns_agree_too(rows: list[dict[str, Any]]) -> None:
    batch = pa.RecordBatch.from_pylist(rows, schema=_ODD)
    got = check_columns(batch, now_ms=NOW, views=VIEWS, may_send=_may_send, limits=LIMITS)
    expected = [_one_at_a_time(r) for r in batch.to_pylist()]
    assert got.code.to_pylist() == [e["code"] for e in expected]
    assert got.message.to_pylist() == [e["message"] for e in expected]
    assert got.deliver_at_ms.to_pylist() == [e["deliver_at_ms"] for e in expected]


@pytest.mark.parametrize("kind", [pa.large_string(), pa.string()])
def test_large_strings_are_column_wise_too(kind: pa.DataType) -> None:
    batch = pa.RecordBatch.from_pydict({"destination": pa.array(["q", "nowhere"], kind)})
    got = check_columns(batch, now_ms=NOW, views=VIEWS)
    assert not got.by_row.any()
    assert got.code.to_pylist() == [None, "unknown_destination"]


def test_a_batch_with_refused_rows_is_freed_after_its_check() -> None:
    # Given a batch where one row names an invalid destination and one fails one at a time
    import gc

    n = 20_000
    names = ["q"] * n
    names[0], names[1] = "bad name!", "q"
    batch = pa.RecordBatch.from_pydict(
        {
            "destination": pa.array(names),
            "body": pa.array([f"body {i}" for i in range(n)]),
            "delay_ms": pa.array([1_000] * n, pa.int64()),
            "headers": pa.array(['{"k": "v"}'] + [None] * (n - 1)),
        }
    )
    gc.collect()
    before = pa.total_allocated_bytes()
    # When it is checked several times and the results dropped
    for _ in range(5):
        checked = check_columns(batch, now_ms=NOW, views=VIEWS)
        assert checked.code[0].as_py() == "invalid_argument"
        del checked
    gc.collect()
    # Then nothing of those checks stays in memory (a refusal kept its traceback, whose frames
    # held the columns, in an object array the collector cannot traverse)
    assert pa.total_allocated_bytes() - before < 64 * 1024
