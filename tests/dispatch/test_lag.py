"""Release lag as the dispatcher keeps it, deterministic with a ManualClock and the in-memory
store and transport (the same path runs for real against a `tarry serve` in
tests/e2e/test_overload.py)."""

from __future__ import annotations

import pytest
from tests.dispatch.test_dispatcher import Harness

from tarry.errors import Overloaded


async def test_no_lag_while_nothing_is_due() -> None:
    h = Harness()
    await h.schedule(5_000)
    await h.round()
    assert h.dispatcher.lag.lag_ms() == 0
    h.dispatcher.lag.refuse_if_behind(1)  # on time: nothing refused


async def test_a_backlog_left_by_a_full_round_counts_from_its_newest_due_time() -> None:
    h = Harness(batch_size=2)
    for _ in range(5):
        await h.schedule(0)
    h.clock.advance(300)
    await h.round()  # took 2 of 5 due 300 ms ago: 3 still wait
    assert h.dispatcher.lag.behind
    assert h.dispatcher.lag.lag_ms() == 300
    h.clock.advance(900)
    assert h.dispatcher.lag.lag_ms() == 1_200
    with pytest.raises(Overloaded) as refused:
        h.dispatcher.lag.refuse_if_behind(1_000)
    assert refused.value.retry_after_s == 1
    assert refused.value.details["release_lag_ms"] == 1_200
    h.dispatcher.lag.refuse_if_behind(0)  # 0 never refuses
    h.dispatcher.lag.refuse_if_behind(1_200)  # at the limit: accepted
    await h.round()
    await h.round()  # the last one: not a full batch
    assert not h.dispatcher.lag.behind
    assert h.dispatcher.lag.lag_ms() == 0
    assert len(h.transport.delivered) == 5


async def test_a_retried_message_counts_from_its_retry_not_its_first_due_time() -> None:
    h = Harness(batch_size=1, number_of_retries=3, retry_backoff_ms=10_000)
    await h.schedule(0)
    h.transport.fail_next(1)
    await h.round()
    h.clock.advance(10_000)
    await h.schedule(0)  # a first attempt due now, so that the round is full
    await h.round()  # takes the retried one (due earliest): a full round, nothing counted
    assert h.dispatcher.lag.lag_ms() == 0


async def test_a_loop_that_sleeps_past_its_wake_time_is_late_itself() -> None:
    h = Harness()
    lag = h.dispatcher.lag
    lag.sleeping(h.clock.now_ms() + 100)
    h.clock.advance(100)
    assert lag.lag_ms() == 0
    h.clock.advance(2_500)
    assert lag.lag_ms() == 2_500
    with pytest.raises(Overloaded) as refused:
        lag.refuse_if_behind(1_000)
    assert refused.value.retry_after_s == 2  # 1.5 s over the limit, rounded up
    lag.awake()
    assert lag.lag_ms() == 0


async def test_work_under_way_counts_from_its_oldest_due_time_until_it_finishes() -> None:
    h = Harness()
    lag = h.dispatcher.lag
    now = h.clock.now_ms()
    token = lag.started([now - 40, now - 700])
    assert lag.lag_ms() == 700
    lag.finished(token)
    assert lag.lag_ms() == 0
