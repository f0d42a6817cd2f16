"""Time: the only module that reads the wall clock, plus duration and RFC 3339 parsing.

Inside tarry every instant is an ``int`` of milliseconds since the Unix epoch and every span an
``int`` of milliseconds; names carry the unit (``deliver_at_ms``, ``ttl_ms``).
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol

from tarry.errors import InvalidArgument
from tarry.model.rules import first_failure, instant_rules

__all__ = [
    "Clock",
    "ManualClock",
    "SystemClock",
    "format_duration_ms",
    "format_rfc3339",
    "parse_duration_ms",
    "parse_instant_ms",
    "parse_retry_after_ms",
    "wait_at_most",
    "whole_number",
]


class Clock(Protocol):
    """Tells the current time; injected wherever "due" or "expired" is decided."""

    def now_ms(self) -> int: ...

    def seconds_until(self, at_ms: int) -> float:
        """Seconds from now until millisecond ``at_ms`` begins (negative once it has), at the
        clock's full precision: a sleep planned from ``now_ms`` alone, which drops the current
        millisecond's fraction, wakes up to 1 ms late."""
        ...


class SystemClock:
    """The machine's wall clock, in epoch milliseconds."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def seconds_until(self, at_ms: int) -> float:
        return (at_ms * 1_000_000 - time.time_ns()) / 1e9


class ManualClock:
    """A clock that moves only when a test moves it."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def seconds_until(self, at_ms: int) -> float:
        return (at_ms - self._now_ms) / 1000

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms


#: ASCII digits only: ``str.isdigit`` also passes "²" (which ``int`` refuses) and "١" (which it
#: reads), and ``\d`` matches every script's digits. At most 30 digits: far past any field's
#: range, so the range rules still answer, and short of ``int``'s limit on digits.
_WHOLE = re.compile(r"-?[0-9]{1,30}")
_DURATION = re.compile(r"\s*([0-9]{1,30})(\.[0-9]{1,30})?\s*(ms|s|m|h|d)?\s*")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def whole_number(text: str) -> int | None:
    """The whole number ``text`` writes in ASCII decimal digits (an optional leading ``-``,
    surrounding spaces allowed), else None. Every edge that reads a number from text uses this."""
    match = _WHOLE.fullmatch(text.strip())
    return None if match is None else int(match.group())


def parse_duration_ms(text: str | int, *, field: str = "duration") -> int:
    """Read ``250ms``, ``5s``, ``1.5s``, ``10m``, ``2h``, ``3d`` (a bare number is milliseconds)."""
    if isinstance(text, bool):
        raise InvalidArgument(f"{field} must be a duration such as 250ms, 5s, 10m, 2h or 3d")
    if isinstance(text, int):
        if text < 0:
            raise InvalidArgument(f"{field} ({text}) must not be negative")
        return text
    match = _DURATION.fullmatch(text)
    if match is None:
        raise InvalidArgument(
            f"{field} {text!r} is not a duration; write it as 250ms, 5s, 10m, 2h or 3d"
        )
    whole, fraction, unit = match.groups()
    size = _UNIT_MS[unit or "ms"]
    if fraction is None:  # whole numbers stay exact (a float has 53 bits)
        return int(whole) * size
    ms = float(whole + fraction) * size
    if ms != int(ms):
        raise InvalidArgument(f"{field} {text!r} is finer than 1 ms; round it to whole ms")
    return int(ms)


def format_duration_ms(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_instant_ms(value: str | int, *, field: str = "time") -> int:
    """An instant given as epoch milliseconds or as an RFC 3339 string (``2027-03-01T09:00Z``)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field} must be epoch milliseconds or an RFC 3339 time")
    if isinstance(value, int):
        error = first_failure(instant_rules(field), value=value)
        if error is not None:
            raise error
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be epoch milliseconds or an RFC 3339 time")
    text = value.strip()
    number = whole_number(text)
    if number is not None:
        return parse_instant_ms(number, field=field)
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise InvalidArgument(
            f"{field} {value!r} is not an RFC 3339 time; write e.g. 2027-03-01T09:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidArgument(
            f"{field} {value!r} has no time zone; add Z or an offset such as +01:00"
        )
    delta = parsed - datetime(1970, 1, 1, tzinfo=UTC)
    ms = (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000
    # A time before 1970 written so is only "the past"; one past 9999 (an offset can reach it)
    # meets the range rule, as epoch milliseconds would.
    return ms if ms < 0 else parse_instant_ms(ms, field=field)


def format_rfc3339(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


#: The longest ``Retry-After`` honoured: a receiver asking for more is retried after a day.
MAX_RETRY_AFTER_MS = 86_400_000


def parse_retry_after_ms(value: str | None, *, now_ms: int) -> int | None:
    """When a ``Retry-After`` header (RFC 9110: delay-seconds or an HTTP-date) lets the next
    request go, in epoch ms, at most ``MAX_RETRY_AFTER_MS`` ahead; None when it is absent or
    unreadable (the sender then keeps its own back-off)."""
    if value is None:
        return None
    text = value.strip()
    if _WHOLE.fullmatch(text):
        seconds = int(text)
        if seconds < 0:
            return None
        return now_ms + min(seconds * 1000, MAX_RETRY_AFTER_MS)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; an obsolete form may parse naive
        when = when.replace(tzinfo=UTC)
    at_ms = int(when.timestamp() * 1000)
    return min(max(at_ms, now_ms), now_ms + MAX_RETRY_AFTER_MS)


async def wait_at_most(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` have passed. ``asyncio.timeout``, not
    ``wait_for``, which makes a task for each wait: the dispatcher sleeps between most rounds
    and consumers wait between releases, so that task would be paid on the hot path."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
