"""Prometheus metrics: counters fed by the engine's events, gauges read at scrape time. Each app
has its own registry, so several servers can live in one test process."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from tarry.engine.api import EngineAPI
from tarry.model.events import Event, EventRun
from tarry.model.message import Message
from tarry.server.thread_cpu import ThreadCPU

__all__ = ["Metrics"]

_LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter(
            "tarry_messages", "State changes of messages", ["event"], registry=self.registry
        )
        self.lateness = _Lateness()
        self.registry.register(self.lateness)
        self.write_path = _WritePath()
        self.registry.register(self.write_path)
        self.registry.register(ThreadCPU())
        self.by_state = Gauge(
            "tarry_messages_by_state", "Messages kept, by state", ["state"], registry=self.registry
        )
        self._counts: dict[str, int] = {}
        self.breaker_open = Gauge(
            "tarry_breaker_open",
            "1 while a circuit breaker is open",
            ["breaker"],
            registry=self.registry,
        )
        self.release_lag = Gauge(
            "tarry_release_lag_seconds",
            "How far behind due time releases are (sends are refused above overload_lag_ms)",
            registry=self.registry,
        )
        self.delivery_lag = Gauge(
            "tarry_delivery_lag_seconds",
            "The largest delivery lag of a queue being consumed (how late its consumers would "
            "receive a message entering it now; sends to it are refused above overload_lag_ms)",
            registry=self.registry,
        )
        self.queues_behind = Gauge(
            "tarry_queues_behind",
            "Queues whose sends are refused because their consumers are behind",
            registry=self.registry,
        )
        self.rows_in_memory = Gauge(
            "tarry_queue_rows_in_memory",
            "Rows of local queues kept in memory, not yet written to the queue database "
            "(ready, in_flight, acked)",
            ["kind"],
            registry=self.registry,
        )
        self.damaged = Gauge(
            "tarry_store_damaged",
            "Damaged records and files the store knows of (each named in /healthz)",
            registry=self.registry,
        )

    def record(
        self, event: str, message: Message, time_ms: int, queue: str | None, reason: str | None
    ) -> None:
        """The engine's event listener (``record_many`` of one event)."""
        self.record_many(((event, message, time_ms, queue, reason),))

    def record_many(self, events: Sequence[Event]) -> None:
        """The engine's event listener for a batch. Counts are kept as plain ints and added to
        the counters at scrape time: a batch send makes thousands of events, and a counter's
        ``inc`` takes a lock each time. A run of one event is counted at once."""
        counts = self._counts
        if isinstance(events, EventRun):
            event = events.event
            counts[event] = counts.get(event, 0) + len(events)
            if event in _TIMED and events.messages:
                self.lateness.observe_ms(events.late_ms())
            return
        late_ms = []
        for event, message, time_ms, _, _ in events:
            counts[event] = counts.get(event, 0) + 1
            if event in _TIMED:
                late_ms.append(time_ms - message.deliver_at_ms)
        if late_ms:
            self.lateness.observe_ms(late_ms)

    async def render(self, engine: EngineAPI) -> tuple[bytes, str]:
        counts, self._counts = self._counts, {}
        for event, count in counts.items():
            self.events.labels(event).inc(count)
        health = engine.health()
        stats: dict[str, Any] = await engine.stats()
        for state, count in stats["messages"].items():
            self.by_state.labels(state).set(count)
        for name, state in health["breakers"].items():
            self.breaker_open.labels(name).set(1 if state == "triggered" else 0)
        self.damaged.set(len(health["damaged"]))
        self.release_lag.set(health["release_lag_ms"] / 1000)
        self.delivery_lag.set(health["delivery_lag_ms"] / 1000)
        self.queues_behind.set(health["queues_behind"])
        for kind, rows in health["queue_rows_in_memory"].items():
            self.rows_in_memory.labels(kind).set(rows)
        self.write_path.figures = stats.get("store_write_path")
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_BOUNDS = [str(float(b)) for b in _LATENESS_BUCKETS]  # "1.0", as ``Histogram`` labels them
_BOUNDS_MS = [round(b * 1000) for b in _LATENESS_BUCKETS]
#: Events whose lateness (time - due) the histogram counts.
_TIMED = frozenset({"released", "delivered"})
#: From how many values a batch's lateness is sorted and cut at the bounds (``observe_ms``).
_SORTED_FROM = 8


class _Lateness(Collector):
    """The release lateness histogram, counted in plain ints: a ``prometheus_client``
    ``Histogram.observe`` takes a lock and walks the buckets, once per released message, on
    the event loop the dispatcher shares. Observations come a batch at a time."""

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENESS_BUCKETS) + 1)  # the last: above every bound
        #: In whole ms, exact whatever the order of the batches.
        self.sum_ms = 0

    def observe_ms(self, late_ms: Sequence[int]) -> None:
        """Count each lateness (ms; below 0 counts as 0) in its bucket. A plain loop, not
        numpy: numpy's fixed cost per call would fall on every single delivered message. A
        batch of ``_SORTED_FROM`` or more is sorted and cut at each bound instead: one
        ``bisect`` a bucket, not one a message."""
        counts = self.counts
        if len(late_ms) < _SORTED_FROM:
            total = 0
            for late in late_ms:
                late = max(late, 0)
                # bisect_left: a value equal to a bound counts in that bound's bucket (le, "<=").
                counts[bisect_left(_BOUNDS_MS, late)] += 1
                total += late
            self.sum_ms += total
            return
        ordered = sorted(late_ms)
        below = bisect_left(ordered, 0)
        if below:
            ordered[:below] = [0] * below
        # bisect_right: how many are at or below a bound (le, "<="); each bucket the rise.
        counted = 0
        for index, bound in enumerate(_BOUNDS_MS):
            upto = bisect_right(ordered, bound, counted)
            counts[index] += upto - counted
            counted = upto
        counts[-1] += len(ordered) - counted
        self.sum_ms += sum(ordered)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, buckets = 0, []
        for bound, count in zip((*_BOUNDS, "+Inf"), self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(
            "tarry_release_lateness_seconds",
            "How long after its due time a message was released or delivered",
            buckets=buckets,
            sum_value=self.sum_ms / 1000,
        )


class _WritePath(Collector):
    """The log store's write path as its ``write_path()`` figures were at this scrape (other
    stores have none: nothing is exported)."""

    def __init__(self) -> None:
        self.figures: dict[str, Any] | None = None

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        figures = self.figures
        if figures is None:
            return
        fsyncs = CounterMetricFamily(
            "tarry_store_fsyncs",
            "fsyncs the log store made, by what they made durable",
            labels=["what"],
        )
        for what, count in sorted(figures["fsyncs"].items()):
            fsyncs.add_metric([what], count)
        yield fsyncs
        yield CounterMetricFamily(
            "tarry_store_group_commits",
            "Group commits of the log store (one WAL write and at most one fsync each)",
            value=figures["group_commits"],
        )
        yield CounterMetricFamily(
            "tarry_store_durable_group_commits",
            "Group commits that carried a durable write (a producer's send): one fsync each",
            value=figures.get("durable_group_commits", 0),
        )
        yield CounterMetricFamily(
            "tarry_store_wal_bytes",
            "Bytes the log store appended to its write-ahead log",
            value=figures.get("wal_bytes", 0),
        )
        for name, key, what in (
            ("tarry_store_snapshot_seconds", "snapshot_seconds", "snapshot"),
            ("tarry_store_checkpoint_seconds", "checkpoint_seconds", "checkpoint"),
        ):
            times = figures.get(key)
            if times is None:
                continue
            cumulative, buckets = 0, []
            for bound, count in zip((*times["bounds"], "+Inf"), times["counts"], strict=True):
                cumulative += count
                buckets.append((bound if bound == "+Inf" else str(float(bound)), cumulative))
            yield HistogramMetricFamily(
                name,
                f"How long each log store {what} took to write (partitions fsynced, snapshot, "
                "manifest naming the WAL position)",
                buckets=buckets,
                sum_value=times["sum"],
            )
