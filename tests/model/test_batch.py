"""The batch form of the send rules: the same answers as one send at a time, in order."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.errors import InvalidArgument, TarryError, UnknownDestination
from tarry.model.accepted import AcceptedColumns
from tarry.model.batch import (
    COLUMN_MIN,
    PLAIN_FIELDS,
    BatchCheck,
    destinations_of,
    parse_batch,
    validate_batch,
)
from tarry.model.fields import FIELDS, field_names
from tarry.model.ids import IdGenerator, id_due_ms
from tarry.model.message import MAX_DELAY_MS, SendPlan, SendRequest
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


# --- BatchCheck.plain: the same answers as columns ----------------------------------------------
_QUEUES_ONLY = {"q": VIEWS["q"]}


_PLAIN_ONLY = st.fixed_dictionaries(
    {
        "destination": st.sampled_from(["q", "t", "nowhere", "bad name"]),
        "delay_ms": st.one_of(st.integers(1, 10**6), st.just(-1), st.just(MAX_DELAY_MS + 1)),
    },
    optional={
        "body": st.one_of(st.none(), st.text(max_size=5)),
        "ttl_ms": st.integers(-1, 10**6),
        "deliver_at": st.integers(NOW - 10, NOW + 10**6),
    },
)


def _may_send(name: str) -> bool:
    return name != "t"


def _assert_plain_agrees(items: list[Any], got: Any) -> None:
    """``BatchCheck.plain``'s answer is each send's answer one send at a time."""
    want = validate_batch(parse_batch(items), now_ms=NOW, views=VIEWS, may_send=_may_send)
    errors, accepted = got
    assert _answers([e for e in errors if e is not None]) == _answers(
        [w for w in want if isinstance(w, TarryError)]
    )
    assert accepted.rows == [i for i, w in enumerate(want) if isinstance(w, SendPlan)]
    for row, m in zip(accepted.rows, accepted.messages(), strict=True):
        plan = want[row]
        assert isinstance(plan, SendPlan) and errors[row] is None
        request = plan.request
        assert (m.destination, m.body, m.sent_at_ms, m.deliver_at_ms, m.expires_at_ms) == (
            request.destination,
            request.body,
            plan.sent_at_ms,
            plan.deliver_at_ms,
            plan.expires_at_ms,
        )
        assert request.message_id is None and request.correlation_id is None


@settings(max_examples=40, deadline=None)
@given(st.lists(_PLAIN_ONLY, min_size=COLUMN_MIN, max_size=300))
def test_plain_columns_agree_with_one_send_at_a_time(items: list[Any]) -> None:
    # Given a big batch of plain sends, valid and not
    # When its verdicts are asked for as columns
    got = BatchCheck(items).plain(now_ms=NOW, views=VIEWS, ids=IdGenerator(), may_send=_may_send)
    # Then each refusal, and each accepted send's message, are what one send at a time gives
    assert got is not None
    _assert_plain_agrees(items, got)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(_PLAIN_ONLY, _PLAIN_ONLY, _ITEM), min_size=COLUMN_MIN, max_size=300))
def test_plain_columns_agree_or_leave_the_batch_to_the_general_path(items: list[Any]) -> None:
    got = BatchCheck(items).plain(now_ms=NOW, views=VIEWS, ids=IdGenerator(), may_send=_may_send)
    if got is not None:
        _assert_plain_agrees(items, got)


def test_plain_sends_to_a_queue_are_answered_as_columns_with_due_ordered_ids() -> None:
    items = [{"destination": "q", "body": "é", "delay_ms": 10 + i} for i in range(COLUMN_MIN)]
    items[3] = {"destination": "q", "delay_ms": -1}
    got = BatchCheck(items).plain(now_ms=NOW, views=_QUEUES_ONLY, ids=IdGenerator())
    assert got is not None
    errors, accepted = got
    assert [i for i, e in enumerate(errors) if e is not None] == [3]
    assert isinstance(errors[3], InvalidArgument)
    assert len(accepted) == COLUMN_MIN - 1 and 3 not in accepted.rows
    assert accepted.body[0] == "é".encode()
    assert [id_due_ms(i) for i in accepted.ids] == accepted.deliver_at_ms.tolist()
    assert accepted.expires_at_ms.tolist() == [-1] * len(accepted)


@pytest.mark.parametrize(
    "extra",
    [{"reply_to": "q"}, {"delay_ms": 0}, {"headers": {"a": "b"}}],
)
def test_a_batch_with_a_send_that_is_not_plain_is_left_to_the_general_path(
    extra: dict[str, Any],
) -> None:
    items = [{"destination": "q", "body": "x", "delay_ms": 10} for _ in range(COLUMN_MIN)]
    items[7] = {**items[7], **extra}
    check = BatchCheck(items)
    assert check.plain(now_ms=NOW, views=_QUEUES_ONLY, ids=IdGenerator()) is None
    # and validate still answers it, once
    planned = check.validate(now_ms=NOW, views=_QUEUES_ONLY)
    assert _answers(planned) == _answers(
        validate_batch(parse_batch(items), now_ms=NOW, views=_QUEUES_ONLY)
    )


def test_a_plain_batch_with_every_send_refused_is_answered_with_its_refusals() -> None:
    # No send names a destination: no column of destinations at all
    items = [{"body": "x", "delay_ms": 10} for _ in range(COLUMN_MIN)]
    got = BatchCheck(items).plain(now_ms=NOW, views={}, ids=IdGenerator())
    assert got is not None
    errors, accepted = got
    assert len(accepted) == 0
    assert _answers(errors) == _answers(validate_batch(parse_batch(items), now_ms=NOW, views={}))


#: A valid value of each field a plain send may not give (``report`` needs ``reply_to``).
_NOT_PLAIN = {
    "body_base64": {"body_base64": "eA=="},
    "headers": {"headers": {"a": "b"}},
    "reply_to": {"reply_to": "q"},
    "report": {"reply_to": "q", "report": "expiration"},
    "on_undeliverable": {"on_undeliverable": "discard"},
    "group_id": {"group_id": "g"},
    "retain": {"retain": True},
    "persistent": {"persistent": True},
}


def test_plain_fields_are_the_column_fields_that_accepted_columns_hold() -> None:
    # The field table decides: each plain field is read column-wise into a column that
    # AcceptedColumns carries, and every other field of a send is listed below as not plain
    held = {f.name for f in dataclass_fields(AcceptedColumns)}
    for f in FIELDS:
        plain = f.column is not None and f.checked is not None and f.checked[0] in held
        assert (f.name in PLAIN_FIELDS) is plain
    assert PLAIN_FIELDS | set(_NOT_PLAIN) == field_names()
    assert not PLAIN_FIELDS & set(_NOT_PLAIN)


@pytest.mark.parametrize("name", sorted(_NOT_PLAIN))
def test_a_send_giving_a_field_that_is_not_plain_leaves_the_batch_to_the_general_path(
    name: str,
) -> None:
    items = [{"destination": "q", "body": "x", "delay_ms": 10} for _ in range(COLUMN_MIN)]
    items[7] = {"destination": "q", "delay_ms": 10, **_NOT_PLAIN[name]}
    assert BatchCheck(items).plain(now_ms=NOW, views=_QUEUES_ONLY, ids=IdGenerator()) is None


@pytest.mark.parametrize("name", sorted(PLAIN_FIELDS - {"destination", "delay_ms"}))
def test_a_send_giving_plain_fields_only_is_answered_as_columns(name: str) -> None:
    value = {
        "body": "y",
        "deliver_at": NOW + 50,
        "ttl_ms": 10**6,
        "message_id": "k",
        "correlation_id": "saga-1",
    }[name]
    items: list[dict[str, Any]] = [{"destination": "q", "delay_ms": 10} for _ in range(COLUMN_MIN)]
    items[7] = {"destination": "q", name: value}
    if name != "deliver_at":
        items[7]["delay_ms"] = 10
    got = BatchCheck(items).plain(now_ms=NOW, views=_QUEUES_ONLY, ids=IdGenerator())
    assert got is not None and got[0][7] is None
    # each of the producer's ids is a column of its own, None for those without one
    for field in ("message_id", "correlation_id"):
        column = getattr(got[1], field)
        if name == field:
            assert column == [None] * 7 + [value] + [None] * (COLUMN_MIN - 8)
        else:
            assert column is None
