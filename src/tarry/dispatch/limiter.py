"""A route's rate limit: a token bucket with an injected clock, pure and deterministic.

The bucket holds at most ``burst`` tokens (one by default) and gains ``rate_per_s`` per second;
a delivery starts only with a token. With one token, starts are spaced ``1000 / rate_per_s`` ms
apart, so any window of one second holds at most ``rate_per_s`` starts (counting from the
actual start times: a start that happens late does not let the next one come sooner).
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
        self._tokens = float(burst)
        self._at_ms = clock.now_ms()

    @property
    def interval_ms(self) -> float:
        return self._interval_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self._at_ms:
            self._tokens = min(
                float(self.burst), self._tokens + (now_ms - self._at_ms) / self._interval_ms
            )
            self._at_ms = now_ms

    def wait_ms(self) -> int:
        """How long until a token is there (0: now)."""
        now = self._clock.now_ms()
        self._refill(now)
        if self._tokens >= 1.0:
            return 0
        return max(1, math.ceil((1.0 - self._tokens) * self._interval_ms))

    def try_take(self) -> bool:
        """Take a token if there is one."""
        now = self._clock.now_ms()
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
