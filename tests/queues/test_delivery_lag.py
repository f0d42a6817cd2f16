"""Delivery lag (tarry.queues.lag) fed by hand, and the send rule it drives; the sampler's SQL
and the whole path run against a real `tarry serve` in tests/e2e/test_slow_consumer.py."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from tarry.errors import Overloaded
from tarry.model.message import Message, SendRequest
from tarry.model.rules import BEHIND_HORIZON_MS
from tarry.model.validate import DestinationView, TargetView, validate_send
from tarry.queues.lag import (
    FULL_PACE_KEPT_MS,
    RATE_MIN_SPAN_MS,
    DeliveryLag,
    QueueHead,
    read_head,
    refusal_limit_ms,
)

NOW = 1_000_000
LIMIT = 1_000


def _consumed_at_pace(lag: DeliveryLag, queue: str, *, per_s: int, full: bool = True) -> int:
    """A consumer that took ``per_s`` a second for ``RATE_MIN_SPAN_MS``, each receive full
    (``full``: it takes all it asks for and leaves more) or emptying the queue; returns the
    time of its last receive."""
    now = NOW
    for _ in range(RATE_MIN_SPAN_MS // 100 + 1):
        taken = per_s // 10
        lag.received(queue, taken=taken, emptied=not full, now_ms=now)
        now += 100
    return now


def _message(queue: str, due_ms: int) -> Message:
    return Message(
        id=f"m{due_ms}",
        destination=queue,
        body=b"x",
        headers={},
        sent_at_ms=NOW,
        deliver_at_ms=due_ms,
        expires_at_ms=None,
    )


def test_a_queue_nobody_reads_has_no_lag_and_is_never_sampled() -> None:
    lag = DeliveryLag()
    # Given messages accepted for a queue no consumer has received from
    lag.accepted([_message("archive", NOW + 10) for _ in range(5)], NOW)
    # Then nothing is sampled and nothing refuses
    assert lag.to_sample(NOW, window_ms=10_000, waiting={}, limit_ms=LIMIT) == {}
    assert lag.lag_ms("archive") == 0
    lag.refuse_if_all_behind(["archive"], LIMIT, queues_of=lambda n: (n,))


def test_the_head_age_counts_once_a_consumer_received() -> None:
    lag = DeliveryLag()
    lag.received("q", taken=10, emptied=False, now_ms=NOW)
    # The first second: no pace yet, so nothing is counted, only the head is looked at.
    assert lag.to_sample(NOW + 10, window_ms=10_000, waiting={}, limit_ms=LIMIT) == {"q": 0}
    lag.sampled(NOW + 10, [("q", QueueHead(oldest_due_ms=NOW - 1_490, ready=40))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 1_500
    assert lag.behind(LIMIT) == {"q": 1_500}
    assert lag.behind(0) == {}  # 0 never refuses
    with pytest.raises(Overloaded) as refused:
        lag.refuse_if_all_behind(["q", "q"], LIMIT, queues_of=lambda n: (n,))
    assert refused.value.retry_after_s == 1
    assert refused.value.details["delivery_lag_ms"] == 1_500
    assert refused.value.details["queue"] == "q"
    assert "overload_lag_ms" in refused.value.message


def test_a_receive_that_came_back_short_clears_the_lag_at_once() -> None:
    lag = DeliveryLag()
    lag.received("q", taken=10, emptied=False, now_ms=NOW)
    lag.sampled(NOW, [("q", QueueHead(NOW - 5_000, 100))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 5_000
    lag.received("q", taken=3, emptied=True, now_ms=NOW + 50)
    assert lag.lag_ms("q") == 0
    # Its consumer waits on an empty queue: nothing to look at.
    assert lag.to_sample(NOW + 100, window_ms=10_000, waiting={"q": 1}, limit_ms=LIMIT) == {}


def test_the_forecast_counts_ready_and_accepted_messages_at_the_consumers_pace() -> None:
    lag = DeliveryLag()
    now = _consumed_at_pace(lag, "q", per_s=1_000)
    # 500 ready, and 1,500 accepted for it due within the next 500 ms: at 1,000 a second the
    # last of them is taken 2 s from now, 1.5 s after it fell due.
    lag.accepted([_message("q", now + 400) for _ in range(1_500)], now)
    lag.accepted([_message("q", now + 60_000)], now)  # beyond the forecast: not counted
    wanted = lag.to_sample(now, window_ms=10_000, waiting={}, limit_ms=LIMIT)
    assert wanted["q"] >= 2_000  # twice what the consumers take within the limit
    lag.sampled(now, [("q", QueueHead(oldest_due_ms=now - 10, ready=500))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 1_500
    assert lag.worst_ms() == 1_500
    # Once their due times passed (released, so among the ready), they no longer count twice.
    lag.sampled(now + 600, [("q", QueueHead(oldest_due_ms=now + 500, ready=0))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 100


@pytest.mark.parametrize("queues", [("q",), ("q", "other", "q", "gone")])
def test_accepted_as_columns_forecasts_as_the_same_messages_do(queues: tuple[str, ...]) -> None:
    # Given two trackers whose consumers keep the same pace on "q" and "other"
    by_message, by_columns = DeliveryLag(), DeliveryLag()
    for lag in (by_message, by_columns):
        now = _consumed_at_pace(lag, "q", per_s=1_000)
        _consumed_at_pace(lag, "other", per_s=1_000)
    # When one is told of a batch as messages and the other as its columns (destinations
    # and due times; some beyond the forecast, some for a queue nobody reads)
    due = [now + 37 * k for k in range(1_200)] + [now + BEHIND_HORIZON_MS + 1]
    destinations = [queues[k % len(queues)] for k in range(len(due))]
    by_message.accepted([_message(q, at) for q, at in zip(destinations, due, strict=True)], now)
    by_columns.accepted_due(destinations, np.array(due, dtype=np.int64), now)
    # Then both forecast the same lag for every queue
    for lag in (by_message, by_columns):
        heads = [(q, QueueHead(now - 5, 100)) for q in ("q", "other")]
        lag.sampled(now, heads, limit_ms=60_000)
    assert by_columns.snapshot() == by_message.snapshot()
    assert by_columns.lag_ms("q") > 0


def test_arrivals_beyond_full_consumers_pace_forecast_lag_and_within_it_none() -> None:
    lag = DeliveryLag()
    # They took 100 a second, each receive full: all they can.
    now = _consumed_at_pace(lag, "q", per_s=100, full=True)
    due = [now + 100 * k + 50 for k in range(10)]
    lag.accepted([_message("q", at) for at in due for _ in range(10)], now)
    lag.sampled(now, [("q", QueueHead(None, 0))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 0  # 100 in the next second, at 100 a second: each on time
    lag.accepted([_message("q", at) for at in due for _ in range(10)], now)
    lag.sampled(now, [("q", QueueHead(None, 0))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 1_000  # 200: the last taken a second after it is due
    # What falls due beyond the limit is not looked at yet.
    lag.accepted([_message("q", now + 5_000) for _ in range(1_000)], now)
    lag.sampled(now, [("q", QueueHead(None, 0))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 1_000


def test_a_burst_for_consumers_with_room_is_not_refused_on_a_forecast() -> None:
    lag = DeliveryLag()
    # They took 100 a second, all there was (receives came back short): their pace is the
    # arrival rate, not what they could take, so a burst ten times that is no lag.
    now = _consumed_at_pace(lag, "q", per_s=100, full=False)
    due = [now + 100 * k + 50 for k in range(10)]
    lag.accepted([_message("q", at) for at in due for _ in range(100)], now)
    lag.sampled(now, [("q", QueueHead(None, 0))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 0
    assert lag.to_sample(now, window_ms=10_000, waiting={"q": 1}, limit_ms=LIMIT) == {}
    assert lag.lag_ms("q") == 0
    # The head's age still counts: a message ready and untaken for 2 s is 2 s late.
    lag.sampled(now, [("q", QueueHead(now - 2_000, 1))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 2_000


def test_an_emptied_queue_still_forecasts_what_falls_due_at_its_last_full_pace() -> None:
    lag = DeliveryLag()
    # Given consumers seen taking all they asked for at 100 a second (a sample measured it)
    now = _consumed_at_pace(lag, "q", per_s=100, full=True)
    lag.sampled(now, [("q", QueueHead(now - 10, 50))], limit_ms=LIMIT)
    # And 200 accepted for the queue, due within the next second
    due = [now + 100 * k + 50 for k in range(10)]
    lag.accepted([_message("q", at) for at in due for _ in range(20)], now)
    # When a receive finds the queue empty
    lag.received("q", taken=0, emptied=True, now_ms=now)
    # Then nothing is ready, yet the last of the 200 is taken a second after it falls due
    assert lag.lag_ms("q") == 1_000
    # And so while the consumer waits on the empty queue, and at a sample
    assert lag.to_sample(now, window_ms=10_000, waiting={"q": 1}, limit_ms=LIMIT) == {}
    assert lag.lag_ms("q") == 1_000
    lag.sampled(now, [("q", QueueHead(None, 0))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 1_000
    with pytest.raises(Overloaded):
        lag.refuse_if_all_behind(["q"], refusal_limit_ms(LIMIT), queues_of=lambda n: (n,))


def test_sends_accepted_between_samples_count_at_once() -> None:
    lag = DeliveryLag()
    now = _consumed_at_pace(lag, "q", per_s=100, full=True)
    lag.sampled(now, [("q", QueueHead(now - 10, 20))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 200  # 20 ready, at 100 a second
    # 40 accepted, due within the forecast (in a batch for a queue nobody reads too): at
    # most 400 ms more, counted before the next sample, so the next send is refused
    lag.accepted([_message(q, now + 300) for q in ["q", "archive"] * 40], now)
    assert lag.lag_ms("q") == 600
    with pytest.raises(Overloaded):
        lag.refuse_if_all_behind(["q"], refusal_limit_ms(LIMIT), queues_of=lambda n: (n,))
    lag.accepted_due(["q"] * 20, np.full(20, now + 300, dtype=np.int64), now)
    assert lag.lag_ms("q") == 800
    # (a batch for one queue alone, read from columns, likewise)
    alone = DeliveryLag()
    _consumed_at_pace(alone, "q", per_s=100, full=True)
    alone.sampled(now, [("q", QueueHead(now - 10, 20))], limit_ms=LIMIT)
    alone.accepted_due(["q"] * 40, np.full(40, now + 300, dtype=np.int64), now)
    with pytest.raises(Overloaded):
        alone.refuse_if_all_behind(["q"], refusal_limit_ms(LIMIT), queues_of=lambda n: (n,))
    # Due beyond the forecast's horizon: not counted yet
    lag.accepted([_message("q", now + 5_000) for _ in range(100)], now)
    assert lag.lag_ms("q") == 800
    # The next sample counts them exactly: the last of the 80 is taken 800 ms from now,
    # 400 ms after it fell due
    lag.sampled(now, [("q", QueueHead(now - 10, 20))], limit_ms=LIMIT)
    assert lag.lag_ms("q") == 400
    # Consumers never seen full have no forecast to add to: a burst is no lag
    lag.received("free", taken=1, emptied=True, now_ms=now)
    lag.accepted([_message("free", now + 300) for _ in range(1_000)], now)
    assert lag.lag_ms("free") == 0


def test_a_full_pace_stands_for_what_consumers_can_take_only_for_a_while() -> None:
    lag = DeliveryLag()
    now = _consumed_at_pace(lag, "q", per_s=100, full=True)
    lag.sampled(now, [("q", QueueHead(now - 10, 50))], limit_ms=LIMIT)
    # Long after, more consumers may take more: the old measure no longer stands, and a
    # burst for the emptied queue is no lag.
    for at in range(now + 1_000, now + FULL_PACE_KEPT_MS, 1_000):
        lag.received("q", taken=1, emptied=True, now_ms=at)  # consumed all along, all taken
    soon = now + FULL_PACE_KEPT_MS - 100
    lag.accepted([_message("q", soon + 500) for _ in range(1_000)], soon)
    lag.received("q", taken=1, emptied=True, now_ms=soon)
    assert lag.lag_ms("q") > 0  # still the measure: 1,000 at 100 a second
    later = now + FULL_PACE_KEPT_MS + 1
    lag.received("q", taken=1, emptied=True, now_ms=later)
    assert lag.lag_ms("q") == 0


def test_a_queue_not_received_from_within_the_window_is_forgotten() -> None:
    lag = DeliveryLag()
    lag.received("q", taken=10, emptied=False, now_ms=NOW)
    lag.sampled(NOW, [("q", QueueHead(NOW - 5_000, 100))], limit_ms=LIMIT)
    assert lag.to_sample(NOW + 10_001, window_ms=10_000, waiting={}, limit_ms=LIMIT) == {}
    assert lag.lag_ms("q") == 0 and lag.snapshot() == {}


def test_a_request_is_refused_whole_only_when_every_destination_is_behind() -> None:
    lag = DeliveryLag()
    lag.received("slow", taken=10, emptied=False, now_ms=NOW)
    lag.sampled(NOW, [("slow", QueueHead(NOW - 3_000, 100))], limit_ms=LIMIT)
    topics = {"news": ("slow", "fast")}

    def queues_of(name: str) -> tuple[str, ...]:
        return topics.get(name, (name,))

    # Another destination in it (a queue on time, a route, a bad name): left to the rules.
    lag.refuse_if_all_behind(["slow", "fast"], LIMIT, queues_of=queues_of)
    lag.refuse_if_all_behind(["slow", None], LIMIT, queues_of=queues_of)
    # A token that may not send there learns nothing of the queue's lag.
    lag.refuse_if_all_behind(["slow"], LIMIT, queues_of=queues_of, may_send=lambda n: False)
    # A topic is behind when any subscribed queue is (its publish would be refused whole).
    with pytest.raises(Overloaded) as refused:
        lag.refuse_if_all_behind(["news", "slow"], LIMIT, queues_of=queues_of)
    assert refused.value.retry_after_s == 2 and refused.value.details["queue"] == "slow"


def test_the_send_rule_refuses_a_send_to_a_queue_whose_consumers_are_behind() -> None:
    request = SendRequest(destination="q", body=b"x")
    behind = DestinationView("q", "queue", (TargetView("q", lag_ms=2_500, lag_limit_ms=LIMIT),))
    with pytest.raises(Overloaded) as refused:
        validate_send(request, now_ms=NOW, destination=behind)
    assert refused.value.retry_after_s == 2
    assert refused.value.to_dict()["delivery_lag_ms"] == 2_500
    for fine in (TargetView("q", lag_ms=1_000, lag_limit_ms=LIMIT), TargetView("q", lag_ms=9)):
        validate_send(request, now_ms=NOW, destination=DestinationView("q", "queue", (fine,)))


def test_a_send_due_beyond_the_horizon_is_taken_while_the_consumers_are_behind() -> None:
    behind = DestinationView("q", "queue", (TargetView("q", lag_ms=2_500, lag_limit_ms=LIMIT),))
    # A reminder for next week (or a schedule's occurrences stored ahead) does not wait on
    # today's backlog; one due just inside the horizon still does.
    later = SendRequest(destination="q", body=b"x", delay_ms=BEHIND_HORIZON_MS)
    validate_send(later, now_ms=NOW, destination=behind)
    at = SendRequest(destination="q", body=b"x", deliver_at_ms=NOW + 7 * 86_400_000)
    validate_send(at, now_ms=NOW, destination=behind)
    with pytest.raises(Overloaded):
        soon = SendRequest(destination="q", body=b"x", delay_ms=BEHIND_HORIZON_MS - 1)
        validate_send(soon, now_ms=NOW, destination=behind)


def test_read_head_finds_the_oldest_ready_message_and_counts_up_to_the_cap() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE messages (queue TEXT, state TEXT, seq INTEGER, deliver_at_ms INTEGER, "
        "visible_at_ms INTEGER, redelivered INTEGER)"
    )
    rows = [("q", "ready", seq, 100 + seq, 500 + seq, 0) for seq in range(1, 6)]
    rows += [("q", "delivered", 0, 1, 1, 0), ("other", "ready", 0, 2, 2, 0)]
    conn.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?)", rows)
    assert read_head(conn, "q", 3) == QueueHead(101, 3)
    assert read_head(conn, "q", 0) == QueueHead(101, 0)
    assert read_head(conn, "none", 3) == QueueHead(None, 0)
    # A requeued message counts from its requeue (it was received once already).
    conn.execute("UPDATE messages SET redelivered = 1 WHERE seq = 1 AND queue = 'q'")
    assert read_head(conn, "q", 10) == QueueHead(501, 5)


def test_sends_are_refused_at_half_the_limit_and_never_with_none() -> None:
    assert [refusal_limit_ms(ms) for ms in (1_000, 301, 1, 0)] == [500, 150, 1, 0]
