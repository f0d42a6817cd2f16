"""Bad input is refused by tarry.model with ``invalid_argument`` and a sentence giving the
allowed range, never with another exception (findings 4, 5 and 10 of issue 26)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.errors import InvalidArgument, TarryError
from tarry.model.batch import COLUMN_MIN, BatchCheck
from tarry.model.message import SendPlan
from tarry.model.queue_args import QueueArgs, parse_policy, parse_queue_args
from tarry.model.time import format_rfc3339, parse_duration_ms, parse_instant_ms
from tarry.model.validate import (
    SEND_FIELDS,
    DestinationView,
    TargetView,
    check_name,
    parse_send,
    validate_reschedule,
    validate_send,
)

NOW = 1_700_000_000_000
QUEUE = DestinationView("q", "queue", (TargetView("q"),))
# The documented bounds, written out (the tests also run against code that lacks them):
#: RabbitMQ's largest TTL, 10 years.
MAX_TTL_MS = 315_360_000_000
#: 9999-12-31T23:59:59.999Z.
MAX_INSTANT_MS = 253_402_300_799_999
MAX_INT64 = BIG = (1 << 63) - 1
MAX_PATTERN_CHARS = 1000


def _verdict(item: Any) -> SendPlan | TarryError:
    try:
        request = parse_send(item)
        view = QUEUE if request.destination == "q" else DestinationView(request.destination, None)
        return validate_send(request, now_ms=NOW, destination=view)
    except TarryError as exc:
        return exc


# --- finding 4: a policy pattern cannot stall the server ----------------------------------------
def test_finding_04_catastrophic_pattern_matches_a_long_name_at_once() -> None:
    # Python's backtracking re takes seconds on this name (doubling with each "a").
    policy = parse_policy("slow", {"pattern": r"^billing\.(a+)+$"})
    name = "billing." + "a" * 25 + "-"  # 34 characters, matches up to the last one
    started = time.perf_counter()
    assert policy.matches(name) is False
    assert time.perf_counter() - started < 0.1
    assert policy.matches("billing." + "a" * 25)


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"^(a)\1$", r"\1"),
        (r"^orders(?=\.eu)", "(?="),
        (r"^(?!billing)", "(?!"),
        (r"(?<=x)y", "(?<="),
    ],
)
def test_finding_04_pattern_re2_cannot_run_is_refused_naming_the_construct(
    pattern: str, construct: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_policy("p", {"pattern": pattern})
    assert construct in caught.value.message
    assert "RE2" in caught.value.message


def test_finding_04_pattern_length_is_bounded() -> None:
    parse_policy("p", {"pattern": "a" * MAX_PATTERN_CHARS})
    with pytest.raises(InvalidArgument, match=f"at most {MAX_PATTERN_CHARS}"):
        parse_policy("p", {"pattern": "a" * (MAX_PATTERN_CHARS + 1)})


def test_policy_patterns_keep_rabbitmqs_search_semantics() -> None:
    prefix = parse_policy("p", {"pattern": "^orders"})
    assert prefix.matches("orders.eu") and not prefix.matches("x.orders")
    inside = parse_policy("p", {"pattern": r"\.eu"})
    assert inside.matches("orders.eu.1") and not inside.matches("orders")
    whole = parse_policy("p", {"pattern": "^orders$"})
    assert whole.matches("orders") and not whole.matches("orders.eu")


# --- finding 10: names are matched whole --------------------------------------------------------
@pytest.mark.parametrize("name", ["nl\n", "orders.eu\n"])
def test_finding_10_a_name_with_a_trailing_newline_is_refused(name: str) -> None:
    _name_refused(name)


@pytest.mark.parametrize("name", ["orders\r\n", "\nq", "a\nb"])
def test_a_name_with_any_other_line_break_stays_refused(name: str) -> None:
    _name_refused(name)


def _name_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match="not a valid name"):
        check_name(name)
    assert isinstance(_verdict({"destination": name}), InvalidArgument)
    with pytest.raises(InvalidArgument):
        parse_queue_args({"dead_letter_to": name})
    with pytest.raises(InvalidArgument):
        parse_policy(name, {"pattern": "^q"})


# --- finding 5: every number bounded before it reaches struct, numpy or a parser ----------------
@pytest.mark.parametrize("ttl", [BIG, 1 << 64, MAX_TTL_MS + 1])
def test_finding_05_ttl_out_of_range_is_refused_with_the_range(ttl: int) -> None:
    verdict = _verdict({"destination": "q", "ttl_ms": ttl})
    assert isinstance(verdict, InvalidArgument)
    assert f"0 to {MAX_TTL_MS}" in verdict.message
    accepted = _verdict({"destination": "q", "ttl_ms": MAX_TTL_MS})
    assert isinstance(accepted, SendPlan) and accepted.expires_at_ms == NOW + MAX_TTL_MS


@pytest.mark.parametrize("at", [MAX_INSTANT_MS + 1, BIG, 1 << 70, str(BIG)])
def test_finding_05_deliver_at_past_year_9999_is_refused(at: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_instant_ms(at, field="deliver_at")
    assert "deliver_at" in caught.value.message
    assert parse_instant_ms(MAX_INSTANT_MS) == MAX_INSTANT_MS
    format_rfc3339(MAX_INSTANT_MS)  # what the bound is for: every accepted time can be written


def test_finding_05_an_offset_past_year_9999_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="out of range"):
        parse_instant_ms("9999-12-31T23:30:00-01:00", field="due_after")


@pytest.mark.parametrize("text", ["²", "¹²", "١٢", "１２", "12²", " ³ ", "9" * 5000])
def test_finding_05_a_time_written_in_non_ascii_digits_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="deliver_at"):
        parse_instant_ms(text, field="deliver_at")
    assert isinstance(_verdict({"destination": "q", "deliver_at": text}), InvalidArgument)
    with pytest.raises(InvalidArgument):
        validate_reschedule({"deliver_at": text}, now_ms=NOW, expires_at_ms=None)


def test_whole_number_reads_ascii_decimal_only() -> None:
    from tarry.model.time import whole_number

    assert whole_number("1700000000000") == 1_700_000_000_000
    assert whole_number(" 42 ") == 42
    assert whole_number("-5") == -5
    for text in ["²", "١٢", "１２", "1e3", "0x10", "1_000", "", "-", "+5", "4.0", "9" * 31]:
        assert whole_number(text) is None, text


@pytest.mark.parametrize("text", ["9" * 5000, "1" * 400 + ".5s", "١٢s"])
def test_finding_05_a_duration_of_huge_or_non_ascii_digits_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="duration"):
        parse_duration_ms(text, field="delay")


def test_durations_stay_exact_past_a_floats_precision() -> None:
    assert parse_duration_ms("9007199254740993") == 9_007_199_254_740_993
    assert parse_duration_ms("1.5s") == 1_500
    assert parse_duration_ms("3d") == 3 * 86_400_000


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("message_ttl_ms", BIG, f"0 to {MAX_TTL_MS}"),
        ("expires_ms", 0, f"1 to {MAX_TTL_MS}"),
        ("max_length", MAX_INT64 + 1, f"0 to {MAX_INT64}"),
        ("max_length", -1, f"0 to {MAX_INT64}"),
        ("max_message_bytes", 1 << 70, f"1 to {MAX_INT64}"),
    ],
)
def test_finding_05_queue_arguments_out_of_range_give_the_range(
    key: str, value: int, allowed: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_queue_args({key: value})
    assert allowed in caught.value.message and key in caught.value.message
    if key != "max_message_bytes":  # not a policy key
        with pytest.raises(InvalidArgument, match=allowed):
            parse_policy("p", {"pattern": "^q", "definition": {key: value}})


@pytest.mark.parametrize("priority", [MAX_INT64 + 1, -MAX_INT64 - 1, 1 << 70])
def test_finding_05_policy_priority_out_of_range_gives_the_range(priority: int) -> None:
    with pytest.raises(InvalidArgument, match=f"-{MAX_INT64} to {MAX_INT64}"):
        parse_policy("p", {"pattern": "^q", "priority": priority})
    assert parse_policy("p", {"pattern": "^q", "priority": -5}).priority == -5


def test_queue_arguments_in_range_are_kept() -> None:
    assert parse_queue_args({"max_length": MAX_INT64, "message_ttl_ms": MAX_TTL_MS}) == QueueArgs(
        max_length=MAX_INT64, message_ttl_ms=MAX_TTL_MS
    )


@pytest.mark.parametrize("size", [3, COLUMN_MIN + 4])
@pytest.mark.parametrize(
    "bad",
    [{"ttl_ms": BIG}, {"ttl_ms": 1 << 64}, {"deliver_at": "²"}],
    ids=lambda bad: repr(bad),
)
def test_finding_05_an_out_of_range_item_fails_only_itself_in_a_batch(
    size: int, bad: dict[str, Any]
) -> None:
    _only_the_bad_item_fails(size, bad)


@pytest.mark.parametrize("size", [3, COLUMN_MIN + 4])
@pytest.mark.parametrize(
    "bad",
    [{"ttl_ms": 1.5}, {"ttl_ms": True}, {"delay_ms": BIG}, {"deliver_at": BIG}],
    ids=lambda bad: repr(bad),
)
def test_other_bad_numbers_fail_only_their_item_in_a_batch(size: int, bad: dict[str, Any]) -> None:
    _only_the_bad_item_fails(size, bad)


def _only_the_bad_item_fails(size: int, bad: dict[str, Any]) -> None:
    # Both forms: one send at a time (small batches) and column by column (from COLUMN_MIN).
    items: list[dict[str, Any]] = [{"destination": "q", "body": f"m{i}"} for i in range(size)]
    items[1] = {"destination": "q", **bad}
    items[2] = {"destination": "q", "ttl_ms": 60_000, "delay_ms": 5}
    check = BatchCheck(items)
    planned = check.validate(now_ms=NOW, views={"q": QUEUE})
    assert isinstance(planned[1], InvalidArgument), planned[1]
    for i, plan in enumerate(planned):
        if i == 1:
            continue
        assert isinstance(plan, SendPlan), (i, plan)
        assert plan.deliver_at_ms == NOW + (5 if i == 2 else 0)
        # A wrapped int64 sum would show as an expiry before the send.
        assert plan.expires_at_ms == (NOW + 60_000 if i == 2 else None)


# --- the send validator raises only TarryError, whatever JSON it is given -----------------------
#: Values at and past every bound, and text that only looks like a number or a name.
EDGES = st.sampled_from(
    [
        BIG,
        BIG + 1,
        -BIG - 1,
        1 << 70,
        MAX_TTL_MS + 1,
        MAX_INSTANT_MS + 1,
        -1,
        0,
        1.5,
        1e308,
        True,
        "²",
        "١٢",
        "9" * 40,
        str(BIG),
        "q\n",
        "10000-01-01T00:00Z",
        "2027-03-01T09:00Z",
    ]
)
JSON_VALUES = st.recursive(
    EDGES | st.none() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)
SENDS = st.dictionaries(st.sampled_from(sorted(SEND_FIELDS)), EDGES | JSON_VALUES, max_size=4).map(
    lambda d: {"destination": "q", **d} if "destination" not in d else d
)


def _plan_is_sane(plan: SendPlan) -> None:
    assert 0 <= plan.deliver_at_ms <= MAX_INSTANT_MS
    assert plan.expires_at_ms is None or plan.deliver_at_ms <= plan.expires_at_ms <= MAX_INT64


@settings(max_examples=400, deadline=None)
@given(SENDS)
def test_the_send_validator_raises_only_tarry_errors(data: dict[str, Any]) -> None:
    verdict = _verdict(data)  # anything but a TarryError propagates and fails the test
    if isinstance(verdict, SendPlan):
        _plan_is_sane(verdict)


@settings(max_examples=60, deadline=None)
@given(SENDS)
def test_a_batch_refuses_only_the_bad_item_whatever_it_holds(data: dict[str, Any]) -> None:
    items: list[Any] = [{"destination": "q", "body": "ok"} for _ in range(COLUMN_MIN)]
    items[7] = data
    planned = BatchCheck(items).validate(now_ms=NOW, views={"q": QUEUE})
    assert sum(isinstance(p, SendPlan) for p in planned) >= COLUMN_MIN - 1
    single = _verdict(data)
    assert type(planned[7]) is type(single)
    for plan in planned:
        if isinstance(plan, SendPlan):
            _plan_is_sane(plan)
