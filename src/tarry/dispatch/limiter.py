"""A route's rate limit: a token bucket (even spacing) and a window limit (the rate as the
receiver sees it), both with an injected clock, pure and deterministic.

The bucket holds at most ``burst`` tokens (one by default) and gains ``rate_per_s`` per second;
a delivery starts only with a token. With one token, starts are at least ``1000 / rate_per_s``
ms apart, counted from the actual start times (a start that happens late lets the next one come
no sooner), so any window of one second holds at most ``rate_per_s`` starts (rounded up when
the rate is fractional). Kept as GCRA's "theoretical arrival time" (when the bucket would be
full again), which is exact for whole-millisecond intervals.
"""

from __future__ import annotations

import math
from collections import deque

from tarry.model.time import Clock

__all__ = ["Slot", "TokenBucket", "WindowLimit"]


class TokenBucket:
    def __init__(self, rate_per_s: float, *, clock: Clock, burst: int = 1) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and at least one token")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        #: Milliseconds per token, as a float: 3/s is 333.33… ms, not 333 (which would let
        #: a fourth start into some second).
        self._interval_ms = 1000.0 / rate_per_s
        #: When the bucket is full again if nothing more is taken (GCRA's TAT).
        self._full_at_ms = float(clock.now_ms())

    @property
    def interval_ms(self) -> float:
        return self._interval_ms

    def _earliest_ms(self) -> float:
        """The earliest time a token is there."""
        return self._full_at_ms - (self.burst - 1) * self._interval_ms

    def wait_ms(self) -> int:
        """How long until a token is there (0: now)."""
        return max(0, math.ceil(self._earliest_ms() - self._clock.now_ms()))

    def try_take(self) -> bool:
        """Take a token if there is one."""
        now = self._clock.now_ms()
        if self._earliest_ms() > now:
            return False
        self._full_at_ms = max(self._full_at_ms, float(now)) + self._interval_ms
        return True


class Slot:
    """One delivery's place in a ``WindowLimit``: when it ended (None while under way)."""

    __slots__ = ("ended_ms",)

    def __init__(self) -> None:
        self.ended_ms: int | None = None


class WindowLimit:
    """At most ``count`` deliveries *arriving* in any window of ``window_ms``, as the receiver
    measures it, whatever the network's jitter: a delivery starts only ``window_ms`` after
    every delivery ``count`` or more starts before it has *ended* (its response came back).

    Why that is enough: a request arrives between its start and its end. Of any ``count + 1``
    requests, the last started is ``count`` or more starts after the first, so it started at
    least ``window_ms`` after the first one ended, hence arrived that much after it. The token
    bucket spaces starts evenly; this makes the rate hold at the receiver too (the first
    request of a burst, slowed by its connection's set-up, cannot bunch up with later ones).
    It costs a slow route a little of its rate: ``count`` per ``window_ms`` + latency.
    """

    def __init__(self, count: int, window_ms: int, *, clock: Clock) -> None:
        self.count = count
        #: One more than asked: times are whole ms, so an end read as ``t`` happened before t+1.
        self.window_ms = window_ms + 1
        self._clock = clock
        #: The last ``count`` starts, oldest first.
        self._recent: deque[Slot] = deque()
        #: The latest end among the starts that left ``_recent``.
        self._ended_ms = -(2**62)

    @classmethod
    def for_rate(cls, rate_per_s: float, *, clock: Clock) -> WindowLimit:
        """``rate_per_s`` as "at most N in any window of N / rate seconds" (N = the rate rounded
        down, at least 1): 5/s is 5 a second, 7.5/s 7 in 933 ms, 0.5/s 1 in 2 s."""
        count = max(1, math.floor(rate_per_s))
        return cls(count, math.ceil(1000 * count / rate_per_s), clock=clock)

    def wait_ms(self) -> int | None:
        """0: a delivery may start now; a positive wait; None: not before a delivery under way
        ends (wait for it)."""
        if len(self._recent) < self.count:
            return 0
        oldest = self._recent[0].ended_ms
        if oldest is None:
            return None
        ready = max(self._ended_ms, oldest) + self.window_ms
        return max(0, ready - self._clock.now_ms())

    def start(self) -> Slot:
        """Record a start (call only after ``wait_ms()`` said 0)."""
        if len(self._recent) >= self.count:
            gone = self._recent.popleft()
            assert gone.ended_ms is not None
            self._ended_ms = max(self._ended_ms, gone.ended_ms)
        slot = Slot()
        self._recent.append(slot)
        return slot

    def end(self, slot: Slot) -> None:
        slot.ended_ms = self._clock.now_ms()
