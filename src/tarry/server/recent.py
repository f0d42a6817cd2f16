"""The last minutes of activity, for the console's live chart: messages in (scheduled) and out
(released into a queue or delivered to a route) and the release lateness (p50, p99, max) per
few seconds. An engine event listener beside ``Metrics``; Prometheus keeps the long history."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import exp, log, log1p
from typing import Any

from tarry.model.events import Event, EventRun

__all__ = ["RecentActivity"]

#: Lateness values kept per window to take percentiles from (a uniform sample beyond that).
SAMPLES_PER_WINDOW = 1024
_OUT = frozenset({"released", "delivered"})


@dataclass
class _Window:
    start_ms: int
    into: int = 0
    out: int = 0
    late_max_ms: int = 0
    samples: list[int] = field(default_factory=list)
    #: Once the sample is full: which lateness (counted from the window's first, from 1) is
    #: kept next, and Algorithm L's weight that draws the skip after it.
    next_kept: int = 0
    weight: float = 1.0

    def observe(self, late_ms: Sequence[int], rng: random.Random) -> None:
        """Count each lateness of a batch (below 0 counts as 0); keep a uniform sample of every
        lateness this window saw (reservoir sampling by Li's Algorithm L: once the sample is
        full, the next value kept is drawn as a skip, so a window of thousands draws a few
        random numbers a kept value, not one a value)."""
        if late_ms and min(late_ms) < 0:
            late_ms = [late if late > 0 else 0 for late in late_ms]
        self.late_max_ms = max(self.late_max_ms, max(late_ms, default=0))
        samples = self.samples
        room = SAMPLES_PER_WINDOW - len(samples)
        if room > 0:
            samples += late_ms[:room]
            self.out += min(room, len(late_ms))
            late_ms = late_ms[room:]
            if len(samples) < SAMPLES_PER_WINDOW:
                return
            self.weight = _scaled_weight(1.0, rng)
            self.next_kept = self.out + _skip(self.weight, rng) + 1
        seen, end = self.out, self.out + len(late_ms)
        kept, weight = self.next_kept, self.weight
        while kept <= end:
            samples[int(rng.random() * SAMPLES_PER_WINDOW)] = late_ms[kept - seen - 1]
            weight = _scaled_weight(weight, rng)
            kept += _skip(weight, rng) + 1
        self.next_kept, self.weight, self.out = kept, weight, end


def _scaled_weight(weight: float, rng: random.Random) -> float:
    """Algorithm L's next weight: ``weight`` times u^(1/k), u uniform in (0, 1]."""
    return weight * exp(log(1.0 - rng.random()) / SAMPLES_PER_WINDOW)


def _skip(weight: float, rng: random.Random) -> int:
    """How many values to pass over before the next one kept (geometric in 1 - weight)."""
    if weight >= 1.0:  # u was 1 exactly: keep the next one
        return 0
    return int(log(1.0 - rng.random()) / log1p(-weight))


def _percentile(ordered: Sequence[int], fraction: float) -> int | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class RecentActivity:
    def __init__(self, *, window_ms: int = 5_000, keep_ms: int = 10 * 60_000) -> None:
        self.window_ms = window_ms
        self.keep = keep_ms // window_ms
        self._windows: dict[int, _Window] = {}
        self._rng = random.Random(0)

    def _window(self, time_ms: int) -> _Window:
        number = time_ms // self.window_ms
        window = self._windows.get(number)
        if window is None:
            window = self._windows[number] = _Window(number * self.window_ms)
            for old in [n for n in self._windows if n <= number - self.keep]:
                del self._windows[old]
        return window

    def record_many(self, events: Sequence[Event]) -> None:
        """The engine's event listener for a batch: its counts and lateness added per window
        (a run of one event at once)."""
        if isinstance(events, EventRun):
            time_ms = events.time_ms
            if events.event == "scheduled":
                self._window(time_ms).into += len(events)
            elif events.event in _OUT and events.messages:
                self._window(time_ms).observe(events.late_ms(), self._rng)
            return
        into: dict[int, int] = {}
        out: dict[int, list[int]] = {}
        for event, message, time_ms, _, _ in events:
            if event == "scheduled":
                into[time_ms] = into.get(time_ms, 0) + 1
            elif event in _OUT:
                out.setdefault(time_ms, []).append(time_ms - message.deliver_at_ms)
        for time_ms, count in into.items():
            self._window(time_ms).into += count
        for time_ms, late in out.items():
            self._window(time_ms).observe(late, self._rng)

    def record(
        self, event: str, message: Any, time_ms: int, queue: str | None, reason: str | None
    ) -> None:
        self.record_many(((event, message, time_ms, queue, reason),))

    def report(self, now_ms: int) -> dict[str, Any]:
        """Every window of the last ``keep`` (oldest first, empty ones included) and the whole
        span's lateness percentiles."""
        last = now_ms // self.window_ms
        windows, everything, late_max = [], [], 0
        for number in range(last - self.keep + 1, last + 1):
            window = self._windows.get(number) or _Window(number * self.window_ms)
            ordered = sorted(window.samples)
            everything += ordered
            late_max = max(late_max, window.late_max_ms)
            windows.append(
                {
                    "start": window.start_ms,
                    "in": window.into,
                    "out": window.out,
                    "lateness_p50_ms": _percentile(ordered, 0.5),
                    "lateness_p99_ms": _percentile(ordered, 0.99),
                    "lateness_max_ms": window.late_max_ms if window.out else None,
                }
            )
        everything.sort()
        return {
            "now": now_ms,
            "window_ms": self.window_ms,
            "windows": windows,
            "lateness_p50_ms": _percentile(everything, 0.5),
            "lateness_p99_ms": _percentile(everything, 0.99),
            "lateness_max_ms": late_max if everything else None,
        }
