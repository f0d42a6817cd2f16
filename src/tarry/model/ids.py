"""tarry's message ids: 26-character, time-sortable, unique (ULID layout, Crockford base32).

A message id made by ``new_due`` also carries the time the message was due when it was made:
the 80 low bits are ``1`` (flag), 42 bits of due milliseconds, 37 bits of a counter. The log
store finds a message's time partition from its id alone (``id_due_ms``), without an id index.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["IdGenerator", "id_due_ms", "id_time_ms", "ids_due_ms"]

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
        self._count = 0
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

    def new_due(self, now_ms: int, due_ms: int) -> str:
        """An id made at ``now_ms`` for a message due at ``due_ms`` (see the module docstring);
        unique like ``new``, sortable by creation time (not strictly within one millisecond)."""
        with self._lock:
            if now_ms > self._ms:
                self._ms = now_ms
                self._prefix = _encode(now_ms, _TIME_SHIFTS)
                self._count = self._random.getrandbits(36)
            else:
                self._count += 1
                if self._count >= 1 << 37:
                    self._ms += 1
                    self._prefix = _encode(self._ms, _TIME_SHIFTS)
                    self._count = 0
            low = _DUE_FLAG | ((due_ms & _DUE_MASK) << 37) | self._count
            return self._prefix + _encode(low, _LOW_SHIFTS)

    def new_due_many(self, now_ms: int, due_ms: np.ndarray) -> np.ndarray:
        """``new_due(now_ms, d)`` for each ``d`` of ``due_ms``, as one ``S26`` array: the same
        layout and counter, computed column-wise (the offline import makes millions)."""
        n = len(due_ms)
        with self._lock:
            if now_ms > self._ms:
                first = self._random.getrandbits(36)
            else:
                first = self._count + 1
            fits = first + n <= 1 << 37
            if fits:
                if now_ms > self._ms:
                    self._ms = now_ms
                    self._prefix = _encode(now_ms, _TIME_SHIFTS)
                self._count = first + n - 1
                prefix = self._prefix
        if not fits:  # the counter rolls over into the next millisecond: one at a time
            return np.array([self.new_due(now_ms, int(d)) for d in due_ms], "S26")
        due = np.asarray(due_ms, np.int64).astype(np.uint64) & np.uint64(_DUE_MASK)
        count = np.arange(first, first + n, dtype=np.uint64)
        high = np.uint64(1 << 39) | (due >> np.uint64(3))  # bits 79..40 of the low 80
        low = ((due & np.uint64(7)) << np.uint64(37)) | count  # bits 39..0
        shifts = np.arange(35, -1, -5, dtype=np.uint64)
        alphabet = np.frombuffer(_ALPHABET.encode(), np.uint8)
        out = np.empty((n, 26), np.uint8)
        out[:, :10] = np.frombuffer(prefix.encode(), np.uint8)
        out[:, 10:18] = alphabet[(high[:, None] >> shifts) & np.uint64(31)]
        out[:, 18:] = alphabet[(low[:, None] >> shifts) & np.uint64(31)]
        return out.view("S26").reshape(n)


_DUE_FLAG = 1 << 79
_DUE_MASK = (1 << 42) - 1


def id_due_ms(message_id: str) -> int | None:
    """The due time a ``new_due`` id carries (None for other ids or text that is no id)."""
    if len(message_id) != 26:
        return None
    value = 0
    try:
        for c in message_id[10:]:
            value = value * 32 + _DECODE[c]
    except KeyError:
        return None
    if not value & _DUE_FLAG:
        return None
    return (value >> 37) & _DUE_MASK


# Each byte's base32 digit, 255 for a byte outside the alphabet (``ids_due_ms``).
_DIGITS = np.full(256, 255, np.uint8)
_DIGITS[np.frombuffer(_ALPHABET.encode(), np.uint8)] = np.arange(32, dtype=np.uint8)
# Eight digits' place values: a 40-bit half of an id's low 80 bits by one product.
_EIGHT_PLACES = np.uint64(1) << np.arange(35, -1, -5, dtype=np.uint64)


def ids_due_ms(message_ids: Sequence[str]) -> npt.NDArray[np.int64]:
    """``id_due_ms`` of each id, as one array, -1 where it gives None: a million ids decoded
    in arrays rather than one by one (cleanup files a deleted partition's keys by them)."""
    count = len(message_ids)
    lengths = np.fromiter(map(len, message_ids), np.int64, count)
    try:
        raw = np.array(message_ids, "S26")
    except UnicodeEncodeError:  # not tarry's ids: one at a time
        return np.array([_or_minus_one(id_due_ms(i)) for i in message_ids], np.int64)
    digits = _DIGITS[raw.view(np.uint8).reshape(count, 26)[:, 10:]]
    wide = digits.astype(np.uint64)
    high = wide[:, :8] @ _EIGHT_PLACES  # bits 79..40
    low = wide[:, 8:] @ _EIGHT_PLACES  # bits 39..0
    due = ((high & np.uint64((1 << 39) - 1)) << np.uint64(3) | low >> np.uint64(37)).astype(
        np.int64
    )
    carries = (lengths == 26) & (digits != 255).all(axis=1) & (high >> np.uint64(39) == 1)
    return np.where(carries, due, -1)


def _or_minus_one(due: int | None) -> int:
    return -1 if due is None else due


def _encode(value: int, shifts: tuple[int, ...]) -> str:
    pairs = _PAIRS
    return "".join([pairs[(value >> shift) & 1023] for shift in shifts])


def id_time_ms(message_id: str) -> int:
    """The creation time encoded in an id's first ten characters."""
    value = 0
    for c in message_id[:10]:
        value = value * 32 + _DECODE[c]
    return value
