"""The delay topology's arithmetic: NServiceBus's own test cases, and properties over every
delay (routing key, starting level, the queues a message waits in, rounding never early)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tarry.config import load_config
from tarry.errors import InvalidArgument
from tarry.model.topology import QueueType, Topology, delay_seconds_for, topic_matches

NSB = Topology(prefix="nsb.v2")
MAX = (1 << 28) - 1


def tail(key: str, words: int) -> str:
    """The last ``words`` delay bits and the address, as NServiceBus's test cases write them."""
    return ".".join(key.split(".")[28 - words :])


@pytest.mark.parametrize(
    ("delay_s", "expected_tail", "level"),
    [
        (0, "0.0.addr", 0),
        (1, "0.1.addr", 0),
        (2, "1.0.addr", 1),
        (3, "1.1.addr", 1),
        (10, "1.0.1.0.addr", 3),
        (15, "1.1.1.1.addr", 3),
        (28, "1.1.1.0.0.addr", 4),
    ],
)
def test_routing_keys_and_levels_match_nservicebus_test_cases(
    delay_s: int, expected_tail: str, level: int
) -> None:
    key = NSB.routing_key(delay_s, "addr")
    assert tail(key, expected_tail.count(".")) == expected_tail
    assert key.startswith("0." * (28 - expected_tail.count(".")))
    assert NSB.starting_level(delay_s) == level


def test_the_largest_delays_use_level_27() -> None:
    assert NSB.routing_key(MAX - 1, "a") == "1." * 27 + "0.a"
    assert NSB.routing_key(MAX, "a") == "1." * 28 + "a"
    assert NSB.starting_level(MAX) == 27


def test_a_delay_past_the_maximum_is_refused_with_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="268435455"):
        NSB.routing_key(MAX + 1, "a")
    with pytest.raises(InvalidArgument):
        NSB.starting_level(365_000 * 86_400)


def test_the_five_second_example_waits_in_levels_2_and_0() -> None:
    key = NSB.routing_key(5, "orders")
    assert NSB.path(key, NSB.starting_level(5)) == [
        "nsb.v2.delay-level-02",
        "nsb.v2.delay-level-00",
        "nsb.v2.delay-delivery",
    ]


def test_names_and_queue_arguments_are_exactly_nservicebus_v2() -> None:
    assert NSB.level_name(7) == "nsb.v2.delay-level-07"
    assert NSB.delivery_exchange == "nsb.v2.delay-delivery"
    assert NSB.queue_arguments(0, QueueType.QUORUM) == {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "nsb.v2.delay-delivery",
    }
    assert NSB.queue_arguments(27, QueueType.CLASSIC) == {
        "x-queue-mode": "lazy",
        "x-message-ttl": 134_217_728_000,
        "x-dead-letter-exchange": "nsb.v2.delay-level-26",
    }
    assert NSB.queue_binding_key(27) == "1.#"
    assert NSB.queue_binding_key(26) == "*.1.#"
    assert NSB.queue_binding_key(0) == "*." * 27 + "1.#"
    assert NSB.pass_binding_key(0) == "*." * 27 + "0.#"


def test_rounding_is_always_up() -> None:
    assert [delay_seconds_for(ms) for ms in (-123, 0, 1, 999, 1000, 1001, 1200)] == [
        0,
        0,
        1,
        1,
        1,
        2,
        2,
    ]


def test_finding_13_a_past_due_time_keeps_its_negative_delay_and_routes_as_zero() -> None:
    # Given a due time 5.5 s in the past
    delay_s = delay_seconds_for(-5_500)
    # Then the delay stays negative, rounded up as NServiceBus's Math.Ceiling does ...
    assert delay_s == -5
    # ... and the routing key spells 0 s, published to level 0 (CalculateRoutingKey clamps)
    assert NSB.routing_key(delay_s, "a") == "0." * 28 + "a"
    assert NSB.starting_level(delay_s) == 0


@pytest.mark.parametrize("prefix", ["nsb.v2", "nsb"])
@pytest.mark.parametrize("levels", [1, 8, 27])
def test_finding_13_nservicebus_prefixes_refuse_any_level_count_but_28(
    prefix: str, levels: int
) -> None:
    with pytest.raises(InvalidArgument, match="always has 28 levels"):
        Topology(prefix=prefix, levels=levels)
    assert Topology(prefix=prefix).levels == 28
    assert Topology(prefix="nsb.v3", levels=levels).levels == levels


def test_finding_13_a_route_with_prefix_nsb_v2_and_other_levels_is_a_config_error() -> None:
    route = {"transport": "rabbitmq", "url": "amqp://x", "mode": "native", "prefix": "nsb.v2"}
    with pytest.raises(InvalidArgument, match=r"routes\.billing.*always has 28 levels"):
        load_config(None, {"routes": {"billing": {**route, "levels": 16}}})
    config = load_config(None, {"routes": {"billing": route}})
    assert config.routes["billing"].levels == 28
    assert config.routes["billing"].routing_topology == "direct"


def test_an_address_that_overflows_the_routing_key_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="255 bytes"):
        NSB.routing_key(1, "q" * 200)
    assert len(NSB.routing_key(1, "q" * 199)) == 255


def test_topic_matching_follows_amqp() -> None:
    assert topic_matches("#.a", "1.0.a")
    assert topic_matches("#.a", "a")
    assert topic_matches("*.1.#", "0.1.x")
    assert not topic_matches("*.1.#", "1.0.x")
    assert topic_matches("1.#", "1")
    assert not topic_matches("*.a", "a")


@given(
    delay_ms=st.integers(min_value=-10_000, max_value=MAX * 1000),
    address=st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="#*"), min_size=1, max_size=40
    ),
)
def test_every_delay_waits_exactly_its_rounded_up_seconds_and_keeps_its_address(
    delay_ms: int, address: str
) -> None:
    delay_s = delay_seconds_for(delay_ms)
    assert delay_s * 1000 >= delay_ms  # never early because of rounding
    assert delay_s * 1000 - delay_ms < 1000
    key = NSB.routing_key(delay_s, address)
    assert NSB.address_of(key) == address
    assert len(key) == 56 + len(address)
    level = NSB.starting_level(delay_s)
    due_s = max(delay_s, 0)  # a due time in the past is due now
    assert due_s >> level <= 1 and (due_s == 0 or due_s >> level == 1)
    path = NSB.path(key, level)
    assert path[-1] == NSB.delivery_exchange
    waited = sum(1 << int(name.rsplit("-", 1)[1]) for name in path[:-1])
    assert waited == due_s


@given(levels=st.integers(min_value=1, max_value=28), data=st.data())
def test_fewer_levels_shorten_the_key_and_the_maximum(levels: int, data: st.DataObject) -> None:
    topology = Topology(prefix="t", levels=levels)
    delay_s = data.draw(st.integers(min_value=0, max_value=topology.max_delay_s))
    key = topology.routing_key(delay_s, "q")
    assert key.count(".") == levels
    path = topology.path(key, topology.starting_level(delay_s))
    assert sum(1 << int(n.rsplit("-", 1)[1]) for n in path[:-1]) == delay_s
    with pytest.raises(InvalidArgument):
        topology.routing_key(topology.max_delay_s + 1, "q")
