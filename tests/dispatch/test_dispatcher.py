"""The dispatcher's retry, error-queue and breaker policy, deterministic with the in-memory store
and transport (the same paths run for real in tests/engine and tests/e2e)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest

from tarry.config import DispatchConfig
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import Dispatcher
from tarry.errors import DeliveryFailed, StorageFault, Unavailable
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.model.time import ManualClock
from tarry.store.memory import MemoryStore
from tarry.transports.memory import MemoryTransport

ids = IdGenerator()


class Harness:
    def __init__(self, **config: int) -> None:
        self.clock = ManualClock(1_700_000_000_000)
        self.config = DispatchConfig(**config)
        self.store = MemoryStore()
        self.transport = MemoryTransport()
        self.breakers = Breakers.from_config(self.config, self.clock)
        self.given_up: list[tuple[Message, DeliveryFailed]] = []
        self.events: list[tuple[str, str]] = []
        self.dispatcher = Dispatcher(
            store=self.store,
            config=self.config,
            clock=self.clock,
            breakers=self.breakers,
            is_local=lambda name: False,
            transport_for=lambda name: self.transport,
            release_local=self._release_local,
            give_up=self._give_up,
            notify=lambda events: self.events.extend((e[0], e[1].id) for e in events),
        )

    async def _release_local(
        self, batch: Sequence[Message]
    ) -> list[tuple[Message, DeliveryFailed]]:
        return []

    async def _give_up(self, message: Message, error: DeliveryFailed) -> None:
        self.given_up.append((message, error))
        await self.store.remove(
            [message.id], state=MessageState.DEAD_LETTERED, now_ms=self.clock.now_ms()
        )

    async def schedule(self, delay_ms: int = 0) -> Message:
        now = self.clock.now_ms()
        m = Message(
            id=ids.new(now),
            destination="ext",
            body=b"x",
            headers={},
            sent_at_ms=now,
            deliver_at_ms=now + delay_ms,
            expires_at_ms=None,
            updated_at_ms=now,
        )
        await self.store.store([m])
        return m

    async def round(self) -> None:
        await self.dispatcher.run_once()
        await self.dispatcher.drain()


async def test_a_delivered_message_is_removed_only_after_the_destination_accepted_it() -> None:
    h = Harness()
    m = await h.schedule(100)
    await h.round()
    assert h.transport.delivered == []
    h.clock.advance(100)
    await h.round()
    assert [d.id for d in h.transport.delivered] == [m.id]
    assert (await h.store.get(m.id)).state is MessageState.DELIVERED


async def test_with_no_retries_the_first_failure_goes_to_the_error_queue() -> None:
    h = Harness()
    m = await h.schedule()
    h.transport.fail_next(1)
    await h.round()
    assert [g.id for g, _ in h.given_up] == [m.id]


async def test_failures_are_retried_with_backoff_up_to_number_of_retries() -> None:
    h = Harness(number_of_retries=2, retry_backoff_ms=1000, retry_backoff_max_ms=10_000)
    m = await h.schedule()
    h.transport.fail_next(2)
    await h.round()
    assert (await h.store.get(m.id)).failures == 1
    await h.round()  # held back until the backoff ends
    assert h.transport.delivered == []
    h.clock.advance(1000)
    await h.round()
    assert (await h.store.get(m.id)).failures == 2
    h.clock.advance(2000)
    await h.round()
    assert [d.id for d in h.transport.delivered] == [m.id]
    assert h.given_up == []


async def test_a_permanent_failure_skips_the_retries() -> None:
    h = Harness(number_of_retries=5)
    await h.schedule()
    h.transport.fail_next(1, DeliveryFailed("gone", reason="not_found", permanent=True))
    await h.round()
    assert len(h.given_up) == 1


async def test_the_dispatch_breaker_opens_after_failing_for_time_to_trigger_and_closes_on_success() -> (
    None
):
    h = Harness(number_of_retries=100, retry_backoff_ms=0, time_to_trigger_dispatch_ms=30_000)
    await h.schedule()
    h.transport.fail_next(2)
    await h.round()
    assert h.breakers.open_names() == []
    h.clock.advance(30_000)
    await h.round()
    assert "dispatch" in h.breakers.open_names()
    h.clock.advance(1)
    await h.round()
    assert h.breakers.open_names() == []


async def test_a_store_that_cannot_fetch_opens_the_fetch_breaker_and_nothing_is_lost() -> None:
    h = Harness(time_to_trigger_fetch_ms=1000)
    m = await h.schedule()
    h.store.fail_next(2, Unavailable("disk gone"))
    with pytest.raises(Unavailable):
        await h.dispatcher.run_once()
    h.breakers.fetch.failure(Unavailable("disk gone"))
    h.clock.advance(1000)
    with pytest.raises(Unavailable):
        await h.dispatcher.run_once()
    h.breakers.fetch.failure(Unavailable("disk gone"))
    assert "fetch" in h.breakers.open_names()
    await h.round()
    assert [d.id for d in h.transport.delivered] == [m.id]
    assert h.breakers.open_names() == []


async def test_while_the_destination_is_away_a_message_is_held_without_counting_an_attempt() -> (
    None
):
    # Given no retries at all: a counted failure would go straight to the error queue
    h = Harness(number_of_retries=0, time_to_trigger_dispatch_ms=5_000)
    m = await h.schedule()
    away = DeliveryFailed("RabbitMQ is down", reason="connect", permanent=False, outage=True)
    h.transport.fail_next(3, away)
    # When the destination is away, round after round
    await h.round()
    assert h.given_up == [] and h.breakers.dispatch.state.value == "armed"
    await h.round()  # held: not offered again before the breaker's wait (1 s while armed)
    assert (await h.store.get(m.id)).failures == 0
    assert await h.dispatcher._next_wake_ms() == h.clock.now_ms() + 1_000
    h.clock.advance(1_000)
    await h.round()
    h.clock.advance(5_000)
    await h.round()
    # Then the breaker opens, the message is still scheduled with no failure counted
    assert h.breakers.open_names() == ["dispatch"]
    message = await h.store.get(m.id)
    assert message.state is MessageState.SCHEDULED and message.failures == 0
    assert h.dispatcher.stats.held == 3
    # When the destination is back, the next attempt (10 s later, once open) delivers it
    h.clock.advance(9_999)
    await h.round()
    assert h.transport.delivered == []
    h.clock.advance(1)
    await h.round()
    assert [d.id for d in h.transport.delivered] == [m.id]
    assert h.given_up == [] and h.breakers.open_names() == []


class BatchMemoryTransport(MemoryTransport):
    """The recording transport, delivering many at once as the RabbitMQ transport does."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def deliver_batch(self, messages: Sequence[Message]) -> list[DeliveryFailed | None]:
        self.batches.append(len(messages))
        outcomes: list[DeliveryFailed | None] = []
        for message in messages:
            try:
                await self.deliver(message)
                outcomes.append(None)
            except DeliveryFailed as exc:
                outcomes.append(exc)
        return outcomes


async def test_a_batch_transport_gets_the_due_messages_at_once_and_failures_stay_separate() -> None:
    h = Harness(number_of_retries=0, batch_size=2)
    h.transport = BatchMemoryTransport()
    messages = [await h.schedule() for _ in range(5)]
    h.transport.fail_next(1, DeliveryFailed("no", reason="nacked", permanent=True))
    for _ in range(3):
        await h.round()
    assert h.transport.batches == [2, 2, 1]
    assert [g.id for g, _ in h.given_up] == [messages[0].id]
    assert sorted(d.id for d in h.transport.delivered) == sorted(m.id for m in messages[1:])
    for m in messages[1:]:
        assert (await h.store.get(m.id)).state is MessageState.DELIVERED


async def test_no_more_is_claimed_while_two_batches_are_still_out() -> None:
    # Given a destination that has not answered yet
    h = Harness(batch_size=2)
    gate = asyncio.Event()
    transport = BatchMemoryTransport()
    original = transport.deliver_batch

    async def slow(messages: Sequence[Message]) -> list[DeliveryFailed | None]:
        await gate.wait()
        return await original(messages)

    transport.deliver_batch = slow  # type: ignore[method-assign]
    h.transport = transport
    for _ in range(6):
        await h.schedule()
    # When two batches are out, the next round waits instead of claiming a third
    assert await h.dispatcher.run_once() and await h.dispatcher.run_once()
    third = asyncio.ensure_future(h.dispatcher.run_once())
    await asyncio.sleep(0.05)
    assert not third.done()
    # Then it goes on once the destination answers
    gate.set()
    assert await third
    await h.dispatcher.drain()
    assert len(transport.delivered) == 6


async def test_the_loop_fetches_the_next_batch_while_a_local_release_commits() -> None:
    # Given local releases that wait for a commit, and three batches due
    h = Harness(batch_size=2)
    h.dispatcher._is_local = lambda name: True
    gate = asyncio.Event()
    started: list[list[str]] = []

    async def committing(batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        started.append([m.id for m in batch])
        await gate.wait()
        await h.store.remove([m.id for m in batch], state=MessageState.READY, now_ms=0)
        return []

    h.dispatcher._release_local = committing
    due = [await h.schedule() for _ in range(6)]
    loop = asyncio.create_task(h.dispatcher.run())
    try:
        await asyncio.sleep(0.05)
        # When the first release has not committed: the second batch is claimed and on its
        # way too, and no third (two full batches of messages in flight at most)
        assert len(started) == 2
        assert sorted(i for batch in started for i in batch) == sorted(m.id for m in due[:4])
        # Then once they commit, the rest follows and each message is released once
        gate.set()
        for _ in range(100):
            if len(started) == 3 and await h.store.count_scheduled() == 0:
                break
            await asyncio.sleep(0.01)
        assert sorted(i for batch in started for i in batch) == sorted(m.id for m in due)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_at_most_four_local_releases_are_under_way_at_once() -> None:
    # Given local releases that wait for a commit (and for their store markers after it)
    h = Harness()
    h.dispatcher._is_local = lambda name: True
    gate = asyncio.Event()
    started: list[str] = []

    async def committing(batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        started.extend(m.id for m in batch)
        await gate.wait()
        await h.store.remove([m.id for m in batch], state=MessageState.READY, now_ms=0)
        return []

    h.dispatcher._release_local = committing
    # When a message falls due before each of five rounds
    for _ in range(4):
        await h.schedule()
        assert await h.dispatcher._round() == 1
    await h.schedule()
    fifth = asyncio.ensure_future(h.dispatcher._round())
    await asyncio.sleep(0.05)
    # Then four releases are under way and the fifth round waits for a place
    assert len(started) == 4 and not fifth.done()
    gate.set()
    assert await fifth == 1
    await h.dispatcher.drain()
    assert len(started) == 5 and await h.store.count_scheduled() == 0


@pytest.mark.parametrize("outcome", ["released", "refused", "store failed"])
async def test_a_local_release_gives_back_its_place_in_flight_however_it_ends(
    outcome: str,
) -> None:
    """A local release keeps its own books as it ends (no done callback): whether its batch
    was released, refused by its queue or not committed, nothing of it stays counted in
    flight, under way or as the release lag's oldest."""
    h = Harness()
    h.dispatcher._is_local = lambda name: True

    async def release(batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        if outcome == "store failed":
            raise Unavailable("the queue database cannot commit now")
        if outcome == "refused":
            return [(m, DeliveryFailed("queue is full", reason="queue_full")) for m in batch]
        await h.store.remove([m.id for m in batch], state=MessageState.READY, now_ms=0)
        return []

    h.dispatcher._release_local = release
    for _ in range(3):
        await h.schedule()
    assert await h.dispatcher._round() == 3
    assert h.dispatcher._inflight_messages == 3 and len(h.dispatcher._releasing) == 1
    await h.dispatcher._released()
    await h.dispatcher.drain()
    assert h.dispatcher._inflight_messages == 0
    assert not h.dispatcher._inflight and not h.dispatcher._releasing
    assert not h.dispatcher.lag._under_way
    released = 3 if outcome == "released" else 0
    assert h.dispatcher.stats.released == released
    assert await h.store.count_scheduled() == (3 if outcome == "store failed" else 0)


@pytest.mark.parametrize("at_once", ["released", "declined", "raised"])
async def test_a_release_at_once_happens_in_the_round_and_anything_else_takes_a_task(
    at_once: str,
) -> None:
    """Local queues kept in memory release in the round itself (``release_at_once``), with no
    task and nothing left in flight; a batch they decline takes ``release_local`` in a task,
    and one whose release at once raised is handled as a failed release (claims given back,
    the store breaker told)."""
    h = Harness()
    h.dispatcher._is_local = lambda name: True
    in_task: list[str] = []

    def release_at_once(batch: Sequence[Message]) -> bool:
        if at_once == "raised":
            raise Unavailable("the log store is closed")
        return at_once == "released"

    async def release(batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        in_task.extend(m.id for m in batch)
        await h.store.remove([m.id for m in batch], state=MessageState.READY, now_ms=0)
        return []

    h.dispatcher._release_at_once = release_at_once
    h.dispatcher._release_local = release
    due = [(await h.schedule()).id for _ in range(3)]
    # A send found the disk full: the store breaker opened at once
    h.breakers.store.failure(StorageFault("no room", cause="disk full"))
    assert await h.dispatcher._round() == 3
    # A release at once wrote nothing, so it did not close it (a healed send or the probe does)
    assert h.breakers.store.is_open
    if at_once == "released":
        assert not h.dispatcher._releasing and h.dispatcher._inflight_messages == 0
    else:
        assert len(h.dispatcher._releasing) == 1
    await h.dispatcher._released()
    assert in_task == (due if at_once == "declined" else [])
    assert h.dispatcher.stats.released == (0 if at_once == "raised" else 3)
    assert h.dispatcher._inflight_messages == 0 and not h.dispatcher.lag._under_way
    if at_once == "raised":  # the claims given back (due again), the breaker armed
        assert h.breakers.store.armed_since_ms is not None
        assert sorted(
            m.id for m in await h.store.fetch_due(h.clock.now_ms(), limit=10, lease_ms=1000)
        ) == sorted(due)


async def test_run_once_returns_once_its_local_release_is_done() -> None:
    h = Harness()
    h.dispatcher._is_local = lambda name: True
    done: list[str] = []

    async def slow(batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        await asyncio.sleep(0.02)
        done.extend(m.id for m in batch)
        return []

    h.dispatcher._release_local = slow
    m = await h.schedule()
    assert await h.dispatcher.run_once()
    assert done == [m.id]


async def test_release_all_due_makes_the_loop_s_rounds_until_nothing_is_due() -> None:
    h = Harness(batch_size=2)
    h.dispatcher._is_local = lambda name: True
    released: list[str] = []

    async def release(batch: Sequence[Message]) -> list[tuple[Message, DeliveryFailed]]:
        await asyncio.sleep(0.001)
        released.extend(m.id for m in batch)
        await h.store.remove([m.id for m in batch], state=MessageState.READY, now_ms=0)
        return []

    h.dispatcher._release_local = release
    due = [await h.schedule() for _ in range(5)]
    later = await h.schedule(1000)
    assert await h.dispatcher.release_all_due() == 3  # 2 + 2 + 1
    assert sorted(released) == sorted(m.id for m in due)
    assert later.id not in released and h.dispatcher.stats.released == 5


async def test_a_store_failing_while_the_loop_plans_its_sleep_does_not_end_the_loop() -> None:
    # Given a store that fails once when asked for the next due time (PostgreSQL restarting
    # between the round and the plan: this used to end the loop and stop delivery for good)
    h = Harness()
    calls = 0
    next_due_time = h.store.next_due_time

    async def failing_once() -> int | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Unavailable("server closed the connection unexpectedly")
        return await next_due_time()

    h.store.next_due_time = failing_once  # type: ignore[method-assign]
    loop = asyncio.create_task(h.dispatcher.run())
    try:
        await asyncio.sleep(0.05)
        assert calls == 1 and not loop.done()
        # When a message falls due afterwards
        m = await h.schedule()
        h.dispatcher.notify_due(m.deliver_at_ms)
        for _ in range(200):
            if h.transport.delivered:
                break
            await asyncio.sleep(0.01)
        # Then the loop is still there and delivers it
        assert [d.id for d in h.transport.delivered] == [m.id]
        assert not loop.done()
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


class _LaggingClock(ManualClock):
    """A clock whose ``now_ms`` lags its true time by ``lag_ms`` (as flooring to the
    millisecond lags by up to 1 ms); ``seconds_until`` counts from the true time."""

    def __init__(self, lag_ms: float) -> None:
        super().__init__()
        self.lag_ms = lag_ms

    def seconds_until(self, at_ms: int) -> float:
        return (at_ms - self.now_ms() - self.lag_ms) / 1000


async def test_the_dispatcher_plans_its_sleep_from_the_clock_s_true_time_not_its_whole_ms() -> None:
    # Given a clock whose true time is 9,999 ms past what now_ms tells
    clock = _LaggingClock(lag_ms=9_999)
    harness = Harness()
    harness.dispatcher._clock = clock
    # When the dispatcher sleeps until now_ms + 10,000
    started = asyncio.get_running_loop().time()
    await harness.dispatcher._sleep_until(clock.now_ms() + 10_000)
    # Then it sleeps the 1 ms the true time leaves, not 10 s
    assert asyncio.get_running_loop().time() - started < 5


def test_the_system_clock_counts_seconds_until_a_millisecond_at_full_precision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from tarry.model import time as tarry_time

    monkeypatch.setattr(tarry_time, "time", SimpleNamespace(time_ns=lambda: 100_900_000))
    clock = tarry_time.SystemClock()
    assert clock.now_ms() == 100  # 100.9 ms
    assert clock.seconds_until(101) == pytest.approx(0.0001)
    assert clock.seconds_until(100) == pytest.approx(-0.0009)


@contextlib.asynccontextmanager
async def _running(h: Harness) -> AsyncIterator[None]:
    """The dispatcher's own loop (``run``) for the block."""
    loop = asyncio.create_task(h.dispatcher.run())
    try:
        yield
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def _delivered(h: Harness, count: int, within_s: float) -> list[str]:
    for _ in range(int(within_s / 0.01)):
        if len(h.transport.delivered) >= count:
            break
        await asyncio.sleep(0.01)
    return [d.id for d in h.transport.delivered]


@pytest.mark.parametrize("tick_ms", [1_000, 0])
async def test_what_falls_due_within_a_tick_of_a_round_waits_for_the_next_round(
    tick_ms: int,
) -> None:
    # Given a loop that has just released a message
    h = Harness(tick_ms=tick_ms)
    first = await h.schedule()
    async with _running(h):
        assert await _delivered(h, 1, within_s=1) == [first.id]
        # When another message falls due (and the loop is told) 100 ms later
        second = await h.schedule()
        h.dispatcher.notify_due(second.deliver_at_ms)
        await asyncio.sleep(0.1)
        # Then within a 1 s tick it waits for the tick's end; with no tick it went at once
        gone = [first.id] if tick_ms else [first.id, second.id]
        assert [d.id for d in h.transport.delivered] == gone
        assert await _delivered(h, 2, within_s=2) == [first.id, second.id]


async def test_a_round_that_found_a_full_batch_is_followed_at_once_whatever_the_tick() -> None:
    # Given five due messages, batches of two and a tick of a second
    h = Harness(tick_ms=1_000, batch_size=2)
    due = [await h.schedule() for _ in range(5)]
    async with _running(h):
        # Then the backlog goes batch after batch without waiting for the tick
        assert sorted(await _delivered(h, 5, within_s=0.5)) == sorted(m.id for m in due)


async def test_an_arrival_told_while_a_round_looks_does_not_cut_the_tick_short() -> None:
    # Given a loop with a 1 s tick, and a message that falls due (and is told) while the
    # round that releases the first one is fetching
    h = Harness(tick_ms=1_000)
    first = await h.schedule()
    fetch_due = h.store.fetch_due
    arrivals: list[Message] = []

    async def fetch_and_arrive(now_ms: int, *, limit: int, lease_ms: int) -> list[Message]:
        due = await fetch_due(now_ms, limit=limit, lease_ms=lease_ms)
        if not arrivals:
            arrivals.append(await h.schedule())
            h.dispatcher.notify_due(arrivals[0].deliver_at_ms)
        return due

    h.store.fetch_due = fetch_and_arrive  # type: ignore[method-assign]
    async with _running(h):
        assert await _delivered(h, 1, within_s=1) == [first.id]
        await asyncio.sleep(0.2)
        # Then the arrival waits for the tick's end: the next round reads the store anyway
        assert [d.id for d in h.transport.delivered] == [first.id]
        assert await _delivered(h, 2, within_s=2) == [first.id, arrivals[0].id]
