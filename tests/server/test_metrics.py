"""The lateness histogram counted in plain ints exports what ``prometheus_client``'s own
``Histogram`` would for the same observations."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

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
    rng = random.Random(7)
    # Bounds themselves (le is "<="), zero, past the last bound, and a spread in between.
    late_ms = [0, 1, 2, 5, 250, 1000, 60_000, 61_000, *(rng.randrange(70_000) for _ in range(500))]
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
        histogram.observe(late / 1000)
        histogram.observe(late / 1000)
    assert _lateness_lines(metrics.registry) == _lateness_lines(reference)
    assert any('le="1.0"} ' in line for line in _lateness_lines(metrics.registry))
