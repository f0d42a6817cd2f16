"""One log line per kind of refusal, not per refusal: a flood of bad requests or connections
must not become a flood of log lines (nor fill the disk the store needs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RefusalLog"]


@dataclass(slots=True)
class _Kind:
    logged_at: float
    unlogged: int = 0


class RefusalLog:
    """Logs the first refusal of a kind at once, then at most one line per ``every_s`` with
    the count of those it did not log."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}

    def note(self, kind: str, message: str) -> None:
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is None:
            self._kinds[kind] = _Kind(logged_at=now)
            self._logger.warning(
                "%s (%s; further ones are counted, one line per %gs)", message, kind, self._every_s
            )
            return
        seen.unlogged += 1
        if now - seen.logged_at >= self._every_s:
            self._logger.warning(
                "%s (%s; %d in the last %.0fs)",
                message,
                kind,
                seen.unlogged,
                now - seen.logged_at,
            )
            seen.logged_at, seen.unlogged = now, 0
