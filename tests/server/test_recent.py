"""The console's recent activity: counts in and out per window and a uniform sample of the
release lateness, whether the events come one by one, as a batch or as a run."""

from __future__ import annotations

import random

from tarry.model.events import Event, EventRun
from tarry.model.message import Message
from tarry.server.recent import SAMPLES_PER_WINDOW, RecentActivity, _Window


def _message(i: int, due_ms: int) -> Message:
    return Message(f"m{i}", "q", b"", {}, 0, due_ms, None)


def test_a_run_and_its_events_one_by_one_give_the_same_windows() -> None:
    # Given 50 messages scheduled at 1 s and released at 6 s, i ms late (one 3 ms early)
    messages = [_message(i, 6_000 - i) for i in range(49)] + [_message(49, 6_003)]
    one, batch, runs = RecentActivity(), RecentActivity(), RecentActivity()
    events: list[Event] = [("scheduled", m, 1_000, None, None) for m in messages]
    events += [("released", m, 6_000, "q", None) for m in messages]
    events += [("acked", m, 6_100, "q", None) for m in messages]
    # When they are told one by one, as one batch, and as runs of one event
    for event in events:
        one.record(*event)
    batch.record_many(events)
    runs.record_many(EventRun("scheduled", messages, 1_000))
    runs.record_many(EventRun("released", messages[:20], 6_000, "q"))
    runs.record_many(EventRun("released", messages[20:], 6_000, "q"))
    runs.record_many(EventRun("acked", messages, 6_100, "q"))
    # Then each reports the same: 50 in, 50 out, the early one counted as 0 ms late
    report = one.report(10_000)
    assert batch.report(10_000) == runs.report(10_000) == report
    assert sum(w["in"] for w in report["windows"]) == 50
    assert sum(w["out"] for w in report["windows"]) == 50
    assert report["lateness_max_ms"] == 48 and report["lateness_p50_ms"] == 24
    assert min(one._windows[1].samples) == 0


def test_a_window_keeps_a_bounded_uniform_sample_of_every_lateness() -> None:
    # Given far more releases in one window than it keeps samples of, late 0..9,999 ms
    activity = RecentActivity()
    count = 10 * SAMPLES_PER_WINDOW
    messages = [_message(i, 20_000 - i) for i in range(count)]
    # When they come in batches of 1,000
    for start in range(0, count, 1_000):
        activity.record_many(EventRun("released", messages[start : start + 1_000], 20_000, "q"))
    # Then every release is counted, the sample stays bounded, and it spans the whole batch
    window = activity._windows[20_000 // activity.window_ms]
    assert window.out == count and len(window.samples) == SAMPLES_PER_WINDOW
    assert window.late_max_ms == count - 1
    late_half = sum(1 for late in window.samples if late >= count // 2)
    assert 0.4 * SAMPLES_PER_WINDOW < late_half < 0.6 * SAMPLES_PER_WINDOW


def test_the_sample_is_uniform_over_the_window_whatever_the_batch_sizes() -> None:
    # Given a window told 0..9,999 ms late in batches of 1 to 1,000, thirty times over
    rng = random.Random(3)
    deciles = [0] * 10
    for _ in range(30):
        window = _Window(0)
        told = 0
        while told < 10_000:
            size = rng.choice([1, 3, 22, 117, 1_000])
            window.observe(list(range(told, min(10_000, told + size))), rng)
            told += size
        # Then every value is counted, the sample is full and holds each value at most once
        assert window.out == 10_000 and len(set(window.samples)) == SAMPLES_PER_WINDOW
        for late in window.samples:
            deciles[late // 1_000] += 1
    # And each tenth of the window's values is as likely to be kept as any other
    expected = 30 * SAMPLES_PER_WINDOW / 10
    assert all(0.9 * expected < count < 1.1 * expected for count in deciles)
