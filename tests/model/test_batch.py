"""The batch form of the send rules: the same answers as one send at a time, in order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.errors import InvalidArgument, TarryError, UnknownDestination
from tarry.model.batch import COLUMN_MIN, BatchCheck, destinations_of, parse_batch, validate_batch
from tarry.model.message import SendPlan, SendRequest
from tarry.model.validate import DestinationView, TargetView, parse_send, validate_send

NOW = 1_700_000_000_000
VIEWS = {
    "q": DestinationView("q", "queue", (TargetView("q"),)),
    "t": DestinationView("t", "topic", (TargetView("a"), TargetView("b", put_enabled=False))),
}
ITEMS = [
    {"destination": "q", "delay_ms": 10},
    {"destination": "q", "delay_ms": 10, "deliver_at": 5},
    {"destination": "nowhere"},
    {"destination": "t"},
    {"destination": "q", "delay_ms": 100, "ttl_ms": 5},
    {"bogus": 1, "destination": "q"},
    {"destination": "q", "deliver_at": "2020-01-01T00:00:00Z"},
]


def _one(item: dict[str, object]) -> SendPlan | TarryError:
    try:
        request = parse_send(item)
        view = VIEWS.get(request.destination, DestinationView(request.destination, None))
        return validate_send(request, now_ms=NOW, destination=view)
    except TarryError as exc:
        return exc


def test_batch_agrees_with_one_send_at_a_time() -> None:
    planned = validate_batch(parse_batch(ITEMS), now_ms=NOW, views=VIEWS)
    assert len(planned) == len(ITEMS)
    for got, item in zip(planned, ITEMS, strict=True):
        want = _one(item)
        if isinstance(want, TarryError):
            assert isinstance(got, TarryError) and (got.code, str(got)) == (want.code, str(want))
        else:
            assert got == want
    assert [getattr(p, "code", "ok") for p in planned] == [
        "ok",
        "invalid_argument",
        "unknown_destination",
        "put_disabled",
        "expiry_error",
        "invalid_argument",
        "ok",
    ]


def test_destinations_and_permissions() -> None:
    parsed = parse_batch(ITEMS)
    assert destinations_of(parsed) == ["q", "nowhere", "t"]
    asked: list[str] = []

    def may_send(name: str) -> bool:
        asked.append(name)
        return name != "q"

    planned = validate_batch(parsed, now_ms=NOW, views=VIEWS, may_send=may_send)
    assert planned[0].code == "not_authorized"  # type: ignore[union-attr]
    assert isinstance(planned[2], UnknownDestination)
    assert sorted(asked) == ["nowhere", "q", "t"]  # once per destination


def test_parse_errors_pass_through() -> None:
    parsed = parse_batch([{"destination": ""}])
    assert isinstance(parsed[0], InvalidArgument)
    with pytest.raises(InvalidArgument):
        raise validate_batch(parsed, now_ms=NOW, views={})[0]  # type: ignore[misc]


# --- BatchCheck: big batches go column-wise, with the same answers -----------------------------
_VALUE = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.integers(NOW - 10**6, NOW + 10**6),
    st.integers(2**63, 2**64),  # does not fit an Arrow int64
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(["q", "t", "nowhere", "bad name", "", "a\x00", "x" * 257, "\ud800"]),
    st.sampled_from(["2020-01-01T00:00:00Z", "soon", "60000"]),
    st.just({"k": "v"}),
    st.just(["expiration"]),
)
_FIELD = st.sampled_from(
    [
        "destination",
        "body",
        "delay_ms",
        "deliver_at",
        "ttl_ms",
        "message_id",
        "correlation_id",
        "group_id",
        "headers",
        "reply_to",
        "bogus",
    ]
)
_PLAIN = st.fixed_dictionaries(
    {"destination": st.sampled_from(["q", "t", "nowhere"])},
    optional={
        "body": st.text(max_size=5),
        "delay_ms": st.integers(-1, 10**6),
        "ttl_ms": st.integers(-1, 10**6),
        "message_id": st.text(max_size=3),
        "correlation_id": st.text(max_size=3),
        "deliver_at": st.integers(NOW - 10, NOW + 10**6),
        "group_id": st.just("g"),
    },
)
_ITEM = st.one_of(
    _PLAIN,
    _PLAIN,
    st.dictionaries(_FIELD, _VALUE, max_size=5),
    st.just("not an object"),
)


def _answers(planned: list[SendPlan | TarryError]) -> list[object]:
    return [(p.code, str(p)) if isinstance(p, TarryError) else p for p in planned]


@settings(max_examples=40, deadline=None)
@given(st.lists(_ITEM, min_size=COLUMN_MIN, max_size=COLUMN_MIN + 40))
def test_batch_check_agrees_with_one_send_at_a_time(items: list[Any]) -> None:
    # Given a big batch of sends, valid, invalid and of odd types
    def may_send(name: str) -> bool:
        return name != "t"

    # When checked in two steps (column-wise where the fields allow)
    check = BatchCheck(items)
    names = check.destinations()
    planned = check.validate(now_ms=NOW, views=VIEWS, may_send=may_send)
    # Then every answer, and the destinations asked about, are those of one send at a time
    parsed = parse_batch(items)
    assert names == destinations_of(parsed)
    assert check.row_destinations() == [
        p.destination if isinstance(p, SendRequest) else None for p in parsed
    ]
    want = validate_batch(parsed, now_ms=NOW, views=VIEWS, may_send=may_send)
    assert _answers(planned) == _answers(want)


def test_batch_check_of_plain_sends_goes_column_wise() -> None:
    items = [{"destination": "q", "body": f"m{i}", "delay_ms": 10} for i in range(COLUMN_MIN)]
    check = BatchCheck(items)
    assert check._columns is not None and not check._columns.by_row.any()
    planned = check.validate(now_ms=NOW, views=VIEWS)
    assert _answers(planned) == _answers(
        validate_batch(parse_batch(items), now_ms=NOW, views=VIEWS)
    )
