"""Queue arguments, policies (who wins), expiry and death records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tarry.errors import InvalidArgument, NotCancellable
from tarry.model.deaths import record_death, would_cycle
from tarry.model.expiry import is_expired, queue_expiry_ms
from tarry.model.ids import IdGenerator, id_time_ms
from tarry.model.message import DeathReason
from tarry.model.queue_args import (
    Overflow,
    QueueArgs,
    effective_args,
    parse_policy,
    parse_queue_args,
)
from tarry.model.state import MessageState, transition
from tarry.model.time import parse_duration_ms, parse_instant_ms


@pytest.mark.parametrize(
    "args",
    [
        {"message_ttl_ms": -1},
        {"expires_ms": 0},
        {"max_length": -1},
        {"overflow": "explode"},
        {"put_enabled": "no"},
        {"dead_letter_to": "bad name"},
        {"colour": 1},
        {"message_ttl_ms": 1.5},
    ],
)
def test_bad_queue_arguments_name_the_key(args: dict) -> None:
    with pytest.raises(InvalidArgument, match=next(iter(args))):
        parse_queue_args(args)


def policy(name: str, pattern: str, priority: int = 0, operator: bool = False, **definition):
    return parse_policy(
        name,
        {"pattern": pattern, "priority": priority, "operator": operator, "definition": definition},
    )


def test_the_lowest_ttl_of_argument_user_and_operator_policy_wins() -> None:
    args = QueueArgs(message_ttl_ms=60_000, max_length=10)
    policies = [
        policy("user", "^orders", message_ttl_ms=30_000, max_length=100),
        policy("ops", "^ord", operator=True, message_ttl_ms=45_000, max_length=5),
    ]
    eff = effective_args("orders", args, policies)
    assert (eff.message_ttl_ms, eff.max_length) == (30_000, 5)


def test_only_the_highest_priority_matching_policy_of_each_kind_applies() -> None:
    policies = [
        policy("low", ".*", 0, message_ttl_ms=1),
        policy("high", "^a", 5, message_ttl_ms=100),
    ]
    eff = effective_args("abc", QueueArgs(), policies)
    assert (eff.policy, eff.message_ttl_ms) == ("high", 100)
    assert effective_args("xyz", QueueArgs(), policies).policy == "low"


def test_the_queue_argument_wins_for_dead_letter_to_and_overflow() -> None:
    policies = [
        policy("p", ".*", dead_letter_to="pdlq", overflow="drop_head"),
        policy("o", ".*", operator=True, overflow="reject_publish"),
    ]
    eff = effective_args("q", QueueArgs(dead_letter_to="mine"), policies)
    assert eff.dead_letter_to == "mine" and eff.overflow is Overflow.REJECT_PUBLISH
    eff = effective_args("q", QueueArgs(overflow=Overflow.DROP_HEAD), policies)
    assert eff.overflow is Overflow.DROP_HEAD


def test_queue_expiry_is_the_earlier_of_message_and_queue_ttl() -> None:
    assert queue_expiry_ms(None, enqueued_at_ms=100, queue_ttl_ms=None) is None
    assert queue_expiry_ms(500, enqueued_at_ms=100, queue_ttl_ms=None) == 500
    assert queue_expiry_ms(None, enqueued_at_ms=100, queue_ttl_ms=50) == 150
    assert queue_expiry_ms(120, enqueued_at_ms=100, queue_ttl_ms=50) == 120
    assert is_expired(100, 100) and not is_expired(100, 99) and not is_expired(None, 10**15)


def test_deaths_keep_one_entry_per_queue_and_reason_newest_first() -> None:
    deaths = record_death([], reason=DeathReason.EXPIRED, queue="a", now_ms=1, destination="a")
    deaths = record_death(deaths, reason=DeathReason.REJECTED, queue="b", now_ms=2, destination="a")
    deaths = record_death(deaths, reason=DeathReason.EXPIRED, queue="a", now_ms=3, destination="a")
    assert [(d.queue, d.reason.value, d.count, d.time_ms) for d in deaths] == [
        ("a", "expired", 2, 1),
        ("b", "rejected", 1, 2),
    ]


def test_a_cycle_without_a_rejection_is_refused() -> None:
    expired = record_death([], reason=DeathReason.EXPIRED, queue="a", now_ms=1, destination="a")
    assert would_cycle(expired, "a") and not would_cycle(expired, "b")
    rejected = record_death(
        expired, reason=DeathReason.REJECTED, queue="b", now_ms=2, destination="a"
    )
    assert not would_cycle(rejected, "a")


def test_ids_sort_by_time_and_carry_it() -> None:
    ids = IdGenerator()
    made = [ids.new(1_700_000_000_000 + i // 5) for i in range(1000)]
    assert made == sorted(made) and len(set(made)) == 1000
    assert all(len(i) == 26 for i in made) and id_time_ms(made[-1]) == 1_700_000_000_000 + 199


@given(st.integers(min_value=0, max_value=2**47))
def test_an_id_round_trips_its_time(now_ms: int) -> None:
    assert id_time_ms(IdGenerator().new(now_ms)) == now_ms


@pytest.mark.parametrize(
    "text,ms",
    [
        ("250ms", 250),
        ("5s", 5000),
        ("1.5s", 1500),
        ("10m", 600_000),
        ("2h", 7_200_000),
        ("3d", 259_200_000),
        ("42", 42),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["5 years", "-1s", "s", "1.0005s", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_duration_ms(text)


def test_instants() -> None:
    assert parse_instant_ms("1970-01-01T00:00:01Z") == 1000
    assert parse_instant_ms("1970-01-01T01:00:01+01:00") == 1000
    assert parse_instant_ms(1234) == 1234


def test_only_scheduled_messages_can_be_cancelled() -> None:
    assert transition("m", MessageState.SCHEDULED, MessageState.CANCELLED) is MessageState.CANCELLED
    with pytest.raises(NotCancellable):
        transition("m", MessageState.READY, MessageState.CANCELLED)
