"""Per-route delivery policy, unit by unit: the checks on its fields, the retry schedule with
jitter, ``Retry-After``, the token bucket, and the dispatcher's use of them with the in-memory
store and transport (the same paths run for real in tests/e2e/test_route_policy.py)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tarry.config import DispatchConfig, RouteConfig, load_config
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import Dispatcher
from tarry.dispatch.limiter import TokenBucket, WindowLimit
from tarry.dispatch.route_policy import failure_report_for, retry_at_ms
from tarry.errors import DeliveryFailed, InvalidArgument
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.route_policy import FAILURE_REPORT_HEADER, RoutePolicy, parse_route_policy
from tarry.model.state import MessageState
from tarry.model.time import MAX_RETRY_AFTER_MS, ManualClock, parse_retry_after_ms
from tarry.store.memory import MemoryStore
from tarry.transports.memory import MemoryTransport

NOW = 1_700_000_000_000
ids = IdGenerator()


# --- the fields ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"rate_per_s": 0}, "rate_per_s (0) must be between 0.001 and 100000"),
        ({"rate_per_s": -1.5}, "rate_per_s (-1.5) must be between"),
        ({"rate_per_s": "fast"}, "rate_per_s must be a number, not 'fast'"),
        ({"rate_per_s": float("nan")}, "rate_per_s must be a finite number"),
        ({"concurrency": 0}, "concurrency (0) must be between 1 and 10000"),
        ({"concurrency": 2.5}, "concurrency must be a whole number, not 2.5"),
        ({"concurrency": True}, "concurrency must be a whole number, not True"),
        ({"retries": -1}, "retries (-1) must be between 0 and 1000"),
        ({"retry_backoff_ms": -5}, "retry_backoff_ms (-5) must be between 0"),
        (
            {"retry_backoff_ms": 500, "retry_backoff_max_ms": 100},
            "retry_backoff_max_ms (100) is shorter than retry_backoff_ms (500)",
        ),
        ({"retry_jitter": 1.5}, "retry_jitter (1.5) must be between 0 and 1"),
        ({"on_failure_report_to": 7}, "on_failure_report_to must be a queue, topic or route"),
        ({"on_failure_report_to": "hooks"}, "route 'hooks' cannot report its failures to itself"),
        ({"dead_letter_to": 7}, "dead_letter_to must be a queue name"),
        ({"dead_letter_to": "has space"}, "dead_letter_to"),
    ],
)
def test_a_bad_policy_field_is_refused_naming_the_field_and_the_fix(
    fields: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_route_policy(fields, route="hooks")
    assert says in refused.value.message


def test_a_good_policy_is_read_with_its_defaults() -> None:
    policy = parse_route_policy({"rate_per_s": 2, "concurrency": 3, "retries": 4})
    assert policy == RoutePolicy(rate_per_s=2.0, concurrency=3, retries=4, retry_jitter=0.2)
    assert policy.limited and not RoutePolicy(retries=3).limited
    named = parse_route_policy({"on_failure_report_to": "ops", "dead_letter_to": "ops.dead"})
    assert (named.on_failure_report_to, named.dead_letter_to) == ("ops", "ops.dead")


def test_a_toml_route_with_a_bad_policy_is_a_config_error_naming_the_route(tmp_path) -> None:
    path = tmp_path / "tarry.toml"
    path.write_text('[routes.hooks]\ntransport = "http"\nurl = "http://x/"\nrate_per_s = 0\n')
    with pytest.raises(InvalidArgument) as refused:
        load_config(path)
    assert f"invalid configuration in config file {path}: routes.hooks" in refused.value.message
    assert "rate_per_s (0.0) must be between 0.001 and 100000" in refused.value.message


def test_a_route_cannot_report_to_itself_in_toml(tmp_path) -> None:
    path = tmp_path / "tarry.toml"
    path.write_text(
        '[routes.hooks]\ntransport = "http"\nurl = "http://x/"\non_failure_report_to = "hooks"\n'
    )
    with pytest.raises(InvalidArgument, match="cannot report its failures to itself"):
        load_config(path)


def test_a_native_rabbitmq_route_refuses_a_rate_limit() -> None:
    with pytest.raises(ValueError, match="rate_per_s and concurrency cannot apply"):
        RouteConfig(transport="rabbitmq", url="amqp://x/", mode="native", rate_per_s=3)


# --- the retry schedule -------------------------------------------------------------------------
@given(
    attempt=st.integers(1, 40),
    base=st.integers(0, 10_000),
    extra=st.integers(0, 100_000),
    jitter=st.floats(0, 1),
    unit=st.floats(0, 1, exclude_max=True),
)
def test_a_retry_delay_stays_within_its_jitter_bounds(
    attempt: int, base: int, extra: int, jitter: float, unit: float
) -> None:
    policy = RoutePolicy(
        retries=1_000, retry_backoff_ms=base, retry_backoff_max_ms=base + extra, retry_jitter=jitter
    )
    at = retry_at_ms(
        attempts=attempt, policy=policy, config=DispatchConfig(), now_ms=NOW, random_unit=unit
    )
    assert at is not None
    plain = min(base + extra, base * 2 ** (attempt - 1))
    assert plain * (1 - jitter) - 1 <= at - NOW <= plain * (1 + jitter) + 1


def test_jitter_spreads_the_retries_of_messages_that_failed_together() -> None:
    policy = RoutePolicy(retries=5, retry_backoff_ms=1_000, retry_jitter=0.5)
    delays = {
        retry_at_ms(attempts=1, policy=policy, config=DispatchConfig(), now_ms=0, random_unit=u)
        for u in (0.0, 0.25, 0.5, 0.75, 0.999)
    }
    assert delays == {500, 750, 1_000, 1_250, 1_499}


def test_the_routes_retries_override_the_global_ones() -> None:
    config = DispatchConfig(number_of_retries=10, retry_backoff_ms=5_000)
    mine = RoutePolicy(retries=1, retry_backoff_ms=100, retry_jitter=0)
    assert retry_at_ms(attempts=1, policy=mine, config=config, now_ms=0, random_unit=0.5) == 100
    assert retry_at_ms(attempts=2, policy=mine, config=config, now_ms=0, random_unit=0.5) is None
    # without a policy of its own a route keeps the global schedule, unjittered as before
    assert retry_at_ms(attempts=2, policy=None, config=config, now_ms=0, random_unit=0.9) == 10_000


def test_retry_after_comes_before_the_back_off_when_it_is_later() -> None:
    policy = RoutePolicy(retries=3, retry_backoff_ms=100, retry_jitter=0)
    at = retry_at_ms(
        attempts=1,
        policy=policy,
        config=DispatchConfig(),
        now_ms=NOW,
        random_unit=0.5,
        not_before_ms=NOW + 7_000,
    )
    assert at == NOW + 7_000


# --- Retry-After --------------------------------------------------------------------------------
def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after_ms("120", now_ms=NOW) == NOW + 120_000
    assert parse_retry_after_ms(" 0 ", now_ms=NOW) == NOW
    date = format_datetime(datetime.fromtimestamp((NOW + 30_000) / 1000, tz=UTC), usegmt=True)
    assert parse_retry_after_ms(date, now_ms=NOW) == NOW + 30_000
    assert parse_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", now_ms=NOW) == NOW  # past
    assert parse_retry_after_ms("999999999", now_ms=NOW) == NOW + MAX_RETRY_AFTER_MS
    for unreadable in (None, "soon", "-5", "", "1.5"):
        assert parse_retry_after_ms(unreadable, now_ms=NOW) is None


# --- the token bucket ---------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [1, 3, 5, 7.5, 50, 1_000])
def test_a_token_bucket_never_lets_more_than_its_rate_into_any_second(rate: float) -> None:
    clock = ManualClock(NOW)
    bucket = TokenBucket(rate, clock=clock)
    starts: list[int] = []
    # a caller that starts whenever it may, checking every millisecond for ten seconds
    for _ in range(10_000):
        while bucket.try_take():
            starts.append(clock.now_ms())
        clock.advance(1)
    most, first = 0, 0
    for last, at in enumerate(starts):  # the most starts in any window [t, t + 1000)
        while starts[first] <= at - 1_000:
            first += 1
        most = max(most, last - first + 1)
    assert most <= max(1, -(-rate // 1))  # at most the rate (rounded up when fractional)
    assert len(starts) >= rate * 10 - 1  # and it does go at the rate


def test_a_token_bucket_says_how_long_until_the_next_token() -> None:
    clock = ManualClock(NOW)
    bucket = TokenBucket(4, clock=clock)
    assert bucket.wait_ms() == 0 and bucket.try_take()
    assert bucket.wait_ms() == 250 and not bucket.try_take()
    clock.advance(249)
    assert bucket.wait_ms() == 1
    clock.advance(1)
    assert bucket.try_take()


@pytest.mark.parametrize("rate", [1, 5, 7.5, 40])
def test_a_window_limit_holds_the_rate_at_the_receiver_whatever_the_latency(rate: float) -> None:
    # Given requests whose trip to the receiver takes anything from 0 to 80 ms (the first of
    # a burst sets up its connection), and deliveries started as fast as both limits allow
    rng = random.Random(7)
    clock = ManualClock(NOW)
    bucket, window = TokenBucket(rate, clock=clock), WindowLimit.for_rate(rate, clock=clock)
    arrivals: list[float] = []
    under_way: list[tuple[int, Any]] = []  # (ends at, slot)
    for _ in range(8_000):
        for ends_at, slot in [u for u in under_way if u[0] <= clock.now_ms()]:
            window.end(slot)
            under_way.remove((ends_at, slot))
        if window.wait_ms() == 0 and bucket.try_take():
            slot = window.start()
            trip = rng.uniform(0, 80)
            arrivals.append(clock.now_ms() + trip)  # arrives on the way ...
            under_way.append((clock.now_ms() + int(trip) + rng.randint(1, 40), slot))  # ... back
        clock.advance(1)
    # Then no window of the rate's span at the receiver holds more than the rate allows
    count = max(1, int(rate))
    span = 1000 * count / rate
    arrivals.sort()
    first = 0
    for last, at in enumerate(arrivals):
        while arrivals[first] <= at - span:
            first += 1
        assert last - first + 1 <= count
    assert len(arrivals) >= 8 * rate * 0.8  # and most of the rate is still used


# --- the dispatcher with a policy ---------------------------------------------------------------
class Harness:
    def __init__(self, policy: RoutePolicy) -> None:
        self.clock = ManualClock(NOW)
        self.config = DispatchConfig()
        self.store = MemoryStore()
        self.transport = MemoryTransport()
        self.given_up: list[Message] = []
        self.reports: list[dict[str, Any]] = []
        self.dispatcher = Dispatcher(
            store=self.store,
            config=self.config,
            clock=self.clock,
            breakers=Breakers.from_config(self.config, self.clock),
            is_local=lambda name: False,
            transport_for=lambda name: self.transport,
            release_local=self._release_local,
            give_up=self._give_up,
            notify=lambda events: None,
            policy_for=lambda name: policy if name == "hooks" else None,
            report_failure=self._report,
            random_unit=lambda: 0.5,
        )

    async def _release_local(self, batch: Sequence[Message]) -> list[Any]:
        return []

    async def _give_up(self, message: Message, error: DeliveryFailed) -> None:
        self.given_up.append(message)
        now = self.clock.now_ms()
        await self.store.remove([message.id], state=MessageState.DEAD_LETTERED, now_ms=now)

    async def _report(self, request: dict[str, Any]) -> None:
        self.reports.append(request)

    async def schedule(self, count: int = 1, headers: dict[str, str] | None = None) -> None:
        now = self.clock.now_ms()
        await self.store.store(
            [
                Message(
                    id=ids.new(now),
                    destination="hooks",
                    body=b"x",
                    headers=dict(headers or {}),
                    sent_at_ms=now,
                    deliver_at_ms=now,
                    expires_at_ms=None,
                    updated_at_ms=now,
                )
                for _ in range(count)
            ]
        )

    async def round(self) -> None:
        await self.dispatcher.run_once()
        await self.dispatcher.lanes.idle()
        await self.dispatcher.drain()


async def test_a_retry_after_pauses_the_route_and_holds_its_other_messages() -> None:
    # Given a route taking one delivery at a time, and three messages due for it
    h = Harness(RoutePolicy(concurrency=1, retries=3, retry_backoff_ms=10, retry_jitter=0))
    await h.schedule(3)
    h.transport.fail_next(
        1, DeliveryFailed("busy", reason="http_429", permanent=False, retry_after="5")
    )
    # When the first answers 429 with Retry-After: 5
    await h.round()
    # Then nothing more goes to the route for 5 s, whatever its back-off says ...
    assert h.transport.delivered == []
    h.clock.advance(4_999)
    await h.round()
    assert h.transport.delivered == []
    # ... and after them all three are delivered, none having lost an attempt but the first
    h.clock.advance(1)
    for _ in range(5):
        await h.round()
    assert len(h.transport.delivered) == 3
    assert sorted(m.failures for m in h.transport.delivered) == [0, 0, 1]


async def test_a_route_gives_up_after_its_own_retries_and_reports_first() -> None:
    h = Harness(RoutePolicy(retries=1, retry_backoff_ms=100, on_failure_report_to="ops"))
    await h.schedule(1)
    h.transport.fail_next(5)
    await h.round()
    assert h.given_up == [] and h.reports == []
    h.clock.advance(120)  # 100 ms ± 20%
    await h.round()
    [dead] = h.given_up
    [report] = h.reports
    assert report["destination"] == "ops" and report["message_id"] == f"failure-report:{dead.id}"
    body = json.loads(report["body"])
    assert (body["id"], body["attempts"], body["reason"]) == (dead.id, 2, "injected")


async def test_a_failure_report_that_fails_is_not_reported_again() -> None:
    policy = RoutePolicy(retries=0, on_failure_report_to="ops")
    message = Message(
        id="m",
        destination="hooks",
        body=b"",
        headers={FAILURE_REPORT_HEADER: "delivery_failed"},
        sent_at_ms=NOW,
        deliver_at_ms=NOW,
        expires_at_ms=None,
        updated_at_ms=NOW,
    )
    error = DeliveryFailed("down", reason="http_500")
    assert failure_report_for(message, error, policy=policy, now_ms=NOW) is None


async def test_a_full_lane_sends_the_rest_back_spread_at_its_pace() -> None:
    # Given a route limited to 2/s and ten messages due at once
    h = Harness(RoutePolicy(rate_per_s=2))
    await h.schedule(10)
    await h.dispatcher.run_once()
    lane = h.dispatcher.lanes.lanes["hooks"]
    # Then the lane keeps about a second's worth; the others wait in the store, each held
    # until about its own turn (not all until the same moment)
    assert lane.queued + lane.active == 2  # the first may have started already
    assert await h.store.fetch_due(NOW, limit=100, lease_ms=1_000) == []
    back = [
        len(await h.store.fetch_due(NOW + s * 1_000, limit=100, lease_ms=60_000))
        for s in (1, 2, 3, 4)
    ]
    assert back == [2, 2, 2, 2]  # one second's worth each second: two every 500 ms
    await h.dispatcher.drain()
    await asyncio.sleep(0)
