"""The lateness histogram counted in plain ints exports what ``prometheus_client``'s own
``Histogram`` would for the same observations."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tarry.model.events import EventRun
from tarry.model.message import Message
from tarry.server.metrics import _LATENESS_BUCKETS, Metrics


def _lateness_lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [
        line
        for line in text.splitlines()
        if "tarry_release_lateness" in line and "_created" not in line
    ]


def test_lateness_matches_a_prometheus_histogram() -> None:
    metrics = Metrics()
    reference = CollectorRegistry()
    histogram = Histogram(
        "tarry_release_lateness_seconds",
        "How long after its due time a message was released or delivered",
        buckets=_LATENESS_BUCKETS,
        registry=reference,
    )
    batch = Metrics()  # the same events given as batches, as the engine gives them
    rng = random.Random(7)
    # Bounds themselves (le is "<="), zero, past the last bound, early (counts as 0), and a
    # spread in between.
    late_ms = [0, 1, 2, 5, 250, 1000, 60_000, 61_000, -3]
    late_ms += [rng.randrange(70_000) for _ in range(500)]
    events = []
    for i, late in enumerate(late_ms):
        message = Message(
            id=f"m{i}",
            destination="q",
            body=b"",
            headers={},
            sent_at_ms=0,
            deliver_at_ms=1_000_000,
            expires_at_ms=None,
        )
        for event in ("released", "received", "delivered"):  # received is not a release
            metrics.record(event, message, 1_000_000 + late, "q", None)
            events.append((event, message, 1_000_000 + late, "q", None))
        histogram.observe(max(0, late) / 1000)
        histogram.observe(max(0, late) / 1000)
    for start in range(0, len(events), 100):
        batch.record_many(events[start : start + 100])
    # The same buckets; the sum to the ms (the reference adds seconds as floats).
    assert _lateness_lines(batch.registry) == _lateness_lines(metrics.registry)
    ours, theirs = _lateness_lines(metrics.registry), _lateness_lines(reference)
    assert [x for x in ours if "_sum" not in x] == [x for x in theirs if "_sum" not in x]
    assert metrics.lateness.sum_ms == 2 * sum(max(0, late) for late in late_ms)
    assert batch._counts == metrics._counts == {"released": 509, "received": 509, "delivered": 509}
    # And as runs (one time, a due time a message), in runs of a few and of many: the same.
    runs = Metrics()
    due = [
        Message(f"r{i}", "q", b"", {}, 0, 1_000_000 - late, None) for i, late in enumerate(late_ms)
    ]
    for event in ("released", "received", "delivered"):
        for start, size in ((0, 3), (3, 100), (103, 406)):
            runs.record_many(EventRun(event, due[start : start + size], 1_000_000, "q"))
    assert _lateness_lines(runs.registry) == _lateness_lines(metrics.registry)
    assert runs.lateness.sum_ms == metrics.lateness.sum_ms
    assert any('le="1.0"} ' in line for line in _lateness_lines(metrics.registry))


def test_a_run_of_one_event_counts_as_its_events_one_by_one() -> None:
    # Given released messages 0..99 ms late, and a few scheduled ones
    messages = [Message(f"m{i}", "q", b"", {}, 0, 1_000 - i, None) for i in range(100)]
    one, runs = Metrics(), Metrics()
    # When one listener gets them event by event and the other as runs
    for message in messages:
        one.record("released", message, 1_000, "q", None)
    for message in messages[:3]:
        one.record("scheduled", message, 5, None, None)
    runs.record_many(EventRun("released", messages[:60], 1_000, "q"))
    runs.record_many(EventRun("released", messages[60:], 1_000, "q"))
    runs.record_many(EventRun("scheduled", messages[:3], 5))
    # Then the counts and the lateness histogram are the same
    assert runs._counts == one._counts == {"released": 100, "scheduled": 3}
    assert _lateness_lines(runs.registry) == _lateness_lines(one.registry)
    assert runs.lateness.sum_ms == sum(range(100))
