"""The send-time rules, one place for all entry points (model/validate.py), in their order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tarry.errors import (
    DestinationFull,
    ExpiryError,
    InvalidArgument,
    MessageTooLarge,
    NotAuthorized,
    OptionsError,
    PutDisabled,
    TarryError,
    UnknownDestination,
)
from tarry.model.message import MAX_DELAY_MS
from tarry.model.validate import (
    DestinationView,
    SendLimits,
    TargetView,
    parse_send,
    validate_reschedule,
    validate_send,
)

NOW = 1_700_000_000_000
DEFAULT_LIMITS = SendLimits()
QUEUE = DestinationView("q", "queue", (TargetView("q"),))


def check(
    data: dict,
    *,
    destination: DestinationView = QUEUE,
    may_send: bool = True,
    limits: SendLimits = DEFAULT_LIMITS,
):
    return validate_send(
        parse_send(data), now_ms=NOW, destination=destination, may_send=may_send, limits=limits
    )


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"destination": ""},
        {"destination": "has space"},
        {"destination": "a/b"},
        {"destination": "q", "delay_ms": 1, "deliver_at": NOW},
        {"destination": "q", "delay_ms": -1},
        {"destination": "q", "delay_ms": "5s"},
        {"destination": "q", "delay_ms": True},
        {"destination": "q", "ttl_ms": 1.5},
        {"destination": "q", "colour": "red"},
        {"destination": "q", "body": "x", "body_base64": "eA=="},
        {"destination": "q", "body_base64": "not base64!"},
        {"destination": "q", "body": 5},
        {"destination": "q", "report": ["expiration"]},
        {"destination": "q", "report": ["weekly"], "reply_to": "r"},
        {"destination": "q", "on_undeliverable": "shrug"},
        {"destination": "q", "headers": {"k": 1}},
        {"destination": "q", "headers": ["k"]},
        {"destination": "q", "deliver_at": "tomorrow"},
        {"destination": "q", "deliver_at": "2027-03-01T09:00:00"},
        {"destination": "q", "retain": "yes"},
        {"destination": "q", "message_id": ""},
    ],
)
def test_malformed_sends_are_refused_with_invalid_argument(data: dict) -> None:
    with pytest.raises(InvalidArgument):
        check(data)


def test_group_or_retain_with_a_delay_is_an_options_error_but_fine_without() -> None:
    with pytest.raises(OptionsError):
        check({"destination": "q", "delay_ms": 10, "group_id": "g"})
    with pytest.raises(OptionsError):
        check({"destination": "q", "delay_ms": 10, "retain": True})
    check({"destination": "q", "group_id": "g", "retain": True})


def test_the_longest_delay_is_2_to_the_28_minus_1_seconds() -> None:
    assert check({"destination": "q", "delay_ms": MAX_DELAY_MS}).deliver_at_ms == NOW + MAX_DELAY_MS
    with pytest.raises(InvalidArgument):
        check({"destination": "q", "delay_ms": MAX_DELAY_MS + 1})


def test_message_with_ttl_shorter_than_delay_is_rejected_with_expiry_error() -> None:
    with pytest.raises(ExpiryError):
        check({"destination": "q", "delay_ms": 5000, "ttl_ms": 4999})
    assert check({"destination": "q", "delay_ms": 5000, "ttl_ms": 5000}).expires_at_ms == NOW + 5000
    assert check({"destination": "q", "delay_ms": 5000}).expires_at_ms is None


def test_ttl_zero_means_expire_on_arrival_at_the_due_time() -> None:
    plan = check({"destination": "q", "delay_ms": 5000, "ttl_ms": 0})
    assert plan.expires_at_ms == plan.deliver_at_ms == NOW + 5000


def test_a_deliver_at_in_the_past_means_now_and_rfc3339_with_offsets_is_read() -> None:
    assert check({"destination": "q", "deliver_at": NOW - 10_000}).deliver_at_ms == NOW
    plan = check({"destination": "q", "deliver_at": "2027-03-01T10:00:00+01:00"})
    assert (
        plan.deliver_at_ms
        == check({"destination": "q", "deliver_at": "2027-03-01T09:00Z"}).deliver_at_ms
    )


def test_destination_rules_come_after_the_time_rules_in_their_documented_order() -> None:
    with pytest.raises(NotAuthorized):
        check({"destination": "q"}, may_send=False)
    with pytest.raises(ExpiryError):  # the time rules are checked first
        check({"destination": "q", "delay_ms": 10, "ttl_ms": 1}, may_send=False)
    with pytest.raises(UnknownDestination):
        check({"destination": "nope"}, destination=DestinationView("nope", None))
    with pytest.raises(PutDisabled):
        check(
            {"destination": "q"},
            destination=DestinationView("q", "queue", (TargetView("q", put_enabled=False),)),
        )
    with pytest.raises(MessageTooLarge):
        check({"destination": "q", "body": "12345"}, limits=SendLimits(max_message_bytes=4))
    with pytest.raises(MessageTooLarge):
        check(
            {"destination": "q", "body": "12345"},
            destination=DestinationView("q", "queue", (TargetView("q", max_message_bytes=4),)),
        )
    with pytest.raises(DestinationFull):
        check(
            {"destination": "q"},
            destination=DestinationView("q", "queue", (TargetView("q", full=True),)),
        )


def test_a_topic_publish_is_refused_when_any_subscriber_copy_would_be() -> None:
    topic = DestinationView("t", "topic", (TargetView("a"), TargetView("b", put_enabled=False)))
    with pytest.raises(PutDisabled):
        check({"destination": "t"}, destination=topic)


def test_reschedule_keeps_the_expiry_of_the_original_send() -> None:
    assert validate_reschedule({"delay_ms": 100}, now_ms=NOW, expires_at_ms=NOW + 100) == NOW + 100
    with pytest.raises(ExpiryError):
        validate_reschedule({"delay_ms": 101}, now_ms=NOW, expires_at_ms=NOW + 100)
    with pytest.raises(InvalidArgument):
        validate_reschedule({"delay_ms": 1, "deliver_at": NOW}, now_ms=NOW, expires_at_ms=None)


sends = st.fixed_dictionaries(
    {"destination": st.just("q")},
    optional={
        "delay_ms": st.integers(min_value=-5, max_value=MAX_DELAY_MS + 5),
        "ttl_ms": st.integers(min_value=-5, max_value=MAX_DELAY_MS + 5),
        "group_id": st.just("g"),
        "retain": st.booleans(),
        "body": st.text(max_size=20),
    },
)


@given(sends)
def test_any_send_is_either_refused_with_a_coded_error_or_planned_consistently(data: dict) -> None:
    try:
        plan = check(data)
    except TarryError as exc:
        assert exc.code in {"invalid_argument", "expiry_error", "options_error"}
        return
    delay = data.get("delay_ms") or 0
    ttl = data.get("ttl_ms")
    assert plan.sent_at_ms == NOW <= plan.deliver_at_ms
    assert plan.deliver_at_ms - plan.sent_at_ms == delay <= MAX_DELAY_MS
    if ttl is None:
        assert plan.expires_at_ms is None
    else:
        assert plan.expires_at_ms is not None and plan.expires_at_ms >= plan.deliver_at_ms
    assert not (delay and (data.get("group_id") or data.get("retain")))
