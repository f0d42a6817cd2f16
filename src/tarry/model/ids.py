"""tarry's message ids: 26-character, time-sortable, unique (ULID layout, Crockford base32)."""

from __future__ import annotations

import random
import threading

__all__ = ["IdGenerator", "id_time_ms"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE = {c: i for i, c in enumerate(_ALPHABET)}
# Two characters per 10 bits: 13 table lookups encode the 130 bits of an id.
_PAIRS = [_ALPHABET[i >> 5] + _ALPHABET[i & 31] for i in range(1024)]
_SHIFTS = tuple(range(120, -1, -10))


class IdGenerator:
    """Makes ids that sort by creation time and stay strictly increasing within one process:
    48 bits of milliseconds, then 80 bits that start random and count up within a millisecond."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0
        self._random = random.Random()  # seeded from the OS; ids need uniqueness, not secrecy

    def new(self, now_ms: int) -> str:
        with self._lock:
            candidate = (now_ms << 80) | self._random.getrandbits(79)
            if candidate <= self._last:
                candidate = self._last + 1
            self._last = candidate
        pairs = _PAIRS
        return "".join([pairs[(candidate >> shift) & 1023] for shift in _SHIFTS])


def id_time_ms(message_id: str) -> int:
    """The creation time encoded in an id's first ten characters."""
    value = 0
    for c in message_id[:10]:
        value = value * 32 + _DECODE[c]
    return value
