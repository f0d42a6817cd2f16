"""A route's rate limit: a token bucket with an injected clock, pure and deterministic.

The bucket holds at most ``burst`` tokens (one by default) and gains ``rate_per_s`` per second;
a delivery starts only with a token. With one token, starts are at least ``1000 / rate_per_s``
ms apart, counted from the actual start times (a start that happens late lets the next one come
no sooner), so any window of one second holds at most ``rate_per_s`` starts (rounded up when
the rate is fractional). Kept as GCRA's "theoretical arrival time" (when the bucket would be
full again), which is exact for whole-millisecond intervals.
"""

from __future__ import annotations

import math

from tarry.model.time import Clock

__all__ = ["TokenBucket"]


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
