"""tarry's message ids: 26-character, time-sortable, unique (ULID layout, Crockford base32)."""

from __future__ import annotations

import os
import threading

__all__ = ["IdGenerator", "id_time_ms"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE = {c: i for i, c in enumerate(_ALPHABET)}


class IdGenerator:
    """Makes ids that sort by creation time and stay strictly increasing within one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def new(self, now_ms: int) -> str:
        with self._lock:
            candidate = (now_ms << 80) | int.from_bytes(os.urandom(10), "big")
            if candidate <= self._last:
                candidate = self._last + 1
            self._last = candidate
        chars = []
        for _ in range(26):
            chars.append(_ALPHABET[candidate & 31])
            candidate >>= 5
        return "".join(reversed(chars))


def id_time_ms(message_id: str) -> int:
    """The creation time encoded in an id's first ten characters."""
    value = 0
    for c in message_id[:10]:
        value = value * 32 + _DECODE[c]
    return value
