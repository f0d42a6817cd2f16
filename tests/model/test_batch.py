"""The batch form of the send rules: the same answers as one send at a time, in order."""

from __future__ import annotations

import pytest

from tarry.errors import InvalidArgument, TarryError, UnknownDestination
from tarry.model.batch import destinations_of, parse_batch, validate_batch
from tarry.model.message import SendPlan
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
