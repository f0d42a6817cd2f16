"""tarry's message ids: 26-character, time-sortable, unique (ULID layout, Crockford base32)."""

from __future__ import annotations

import random
import threading

__all__ = ["IdGenerator", "id_time_ms"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE = {c: i for i, c in enumerate(_ALPHABET)}
# Two characters per 10 bits: 13 table lookups encode the 130 bits of an id.
_PAIRS = [_ALPHABET[i >> 5] + _ALPHABET[i & 31] for i in range(1024)]
# 50 bits of time (48 used) in 10 characters, then 80 bits in 16.
_TIME_SHIFTS = tuple(range(40, -1, -10))
_LOW_SHIFTS = tuple(range(70, -1, -10))


class IdGenerator:
    """Makes ids that sort by creation time and stay strictly increasing within one process:
    48 bits of milliseconds, then 80 bits that start random in each millisecond and count up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = -1
        self._prefix = ""
        self._low = 0
        self._random = random.Random()  # seeded from the OS; ids need uniqueness, not secrecy

    def new(self, now_ms: int) -> str:
        with self._lock:
            if now_ms > self._ms:
                self._ms = now_ms
                self._prefix = _encode(now_ms, _TIME_SHIFTS)
                self._low = self._random.getrandbits(79)
            else:
                # Same millisecond (or a clock that stepped back): keep counting up.
                self._low += 1
                if self._low >= 1 << 80:
                    self._ms += 1
                    self._prefix = _encode(self._ms, _TIME_SHIFTS)
                    self._low = 0
            return self._prefix + _encode(self._low, _LOW_SHIFTS)


def _encode(value: int, shifts: tuple[int, ...]) -> str:
    pairs = _PAIRS
    return "".join([pairs[(value >> shift) & 1023] for shift in shifts])


def id_time_ms(message_id: str) -> int:
    """The creation time encoded in an id's first ten characters."""
    value = 0
    for c in message_id[:10]:
        value = value * 32 + _DECODE[c]
    return value
