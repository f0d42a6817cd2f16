"""Release lag: how far behind due time the dispatcher is, and the intake refusal it drives.

The lag at time ``t`` is ``t`` minus the earliest of:

- the due time of the oldest message claimed but not yet released or delivered (a release or a
  delivery under way, ``started``/``finished``);
- after a round that filled its batch (more due messages wait), the newest due time it took:
  what it left behind falls due no earlier than that (``round_found``);
- while the loop sleeps, the time it meant to wake: a loop that has not woken by then is late
  itself (``sleeping``/``awake``).

A message retried after a failure, or held back while its destination is away, counts from its
retry, not from its first due time: a failing route is not the server being behind.

``refuse_if_behind`` turns a lag above ``[dispatch] overload_lag_ms`` into ``Overloaded`` (HTTP
429 with ``Retry-After``), so that producers are told to wait instead of being accepted for a
delivery that would be late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tarry.errors import Overloaded
from tarry.model.due import DueColumns
from tarry.model.message import Message
from tarry.model.time import Clock

__all__ = ["ReleaseLag"]

#: Held ids remembered before old ones are forgotten, and how old (ms) a hold is forgotten.
_HELD_KEPT = 10_000
_HELD_FORGET_MS = 60_000


class ReleaseLag:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        #: Oldest due time per piece of work under way (a release or a delivery).
        self._under_way: dict[int, int] = {}
        self._next_token = 0
        #: Newest due time the last full round took (None: the last round emptied what was due).
        self._backlog_ms: int | None = None
        #: When the sleeping loop plans to look again (None while it works).
        self._wake_ms: int | None = None
        #: Ids held back (destination away) and until when: they count from then.
        self._held: dict[str, int] = {}
        self._round_done = asyncio.Event()

    # --- fed by the dispatcher ----------------------------------------------------------------
    def due_times(self, messages: Sequence[Message]) -> list[int]:
        """The due times the lag counts from: a first attempt's due time, a held-back message's
        time to try again; a retried message is left out (its retry time is the store's)."""
        held = self._held
        if isinstance(messages, DueColumns):  # none retried: read from the columns
            if not held:
                return list(messages.deliver_at_ms)
            ids = messages.ids
            return [
                max(due, held.get(i, 0)) for i, due in zip(ids, messages.deliver_at_ms, strict=True)
            ]
        if not held:
            return [m.deliver_at_ms for m in messages if not m.failures]
        return [max(m.deliver_at_ms, held.get(m.id, 0)) for m in messages if not m.failures]

    def round_found(self, found: int, *, full: bool, newest_due_ms: int | None) -> None:
        """A round found ``found`` due messages; ``full``: it filled its batch, so more wait."""
        self._backlog_ms = newest_due_ms if full else None
        self._round_done.set()
        self._round_done = asyncio.Event()

    def started(self, due_ms: Sequence[int]) -> int:
        """Work on messages due at ``due_ms`` began; returns the token for ``finished``."""
        self._next_token += 1
        if due_ms:
            self._under_way[self._next_token] = min(due_ms)
        return self._next_token

    def finished(self, token: int) -> None:
        self._under_way.pop(token, None)

    def held(self, message_id: str, until_ms: int) -> None:
        held = self._held
        if len(held) >= _HELD_KEPT:  # forget holds long past (their messages came again)
            cutoff = self._clock.now_ms() - _HELD_FORGET_MS
            for key in [k for k, until in held.items() if until < cutoff]:
                del held[key]
        held[message_id] = until_ms

    def sleeping(self, wake_ms: int) -> None:
        self._wake_ms = wake_ms

    def awake(self) -> None:
        self._wake_ms = None

    # --- read by intake, /healthz and /metrics ------------------------------------------------
    def lag_ms(self) -> int:
        """How far behind due time releases are now (0: on time)."""
        now = self._clock.now_ms()
        oldest = min(self._under_way.values(), default=now)
        if self._backlog_ms is not None:
            oldest = min(oldest, self._backlog_ms)
        if self._wake_ms is not None:
            oldest = min(oldest, self._wake_ms)
        return max(0, now - oldest)

    @property
    def behind(self) -> bool:
        """Due messages wait for a round (the last round filled its batch)."""
        return self._backlog_ms is not None

    async def yield_to_releases(self, *, at_most_ms: int) -> None:
        """Intake's turn comes after the releases': while due messages wait, a send waits for
        the dispatcher's next round (at most ``at_most_ms``) before it does its own work."""
        if self._backlog_ms is None:
            return
        try:
            await asyncio.wait_for(self._round_done.wait(), at_most_ms / 1000)
        except TimeoutError:
            pass

    def refuse_if_behind(self, threshold_ms: int) -> None:
        """Raise ``Overloaded`` when the lag is above ``threshold_ms`` (0: never)."""
        if threshold_ms <= 0:
            return
        lag = self.lag_ms()
        if lag <= threshold_ms:
            return
        retry_after_s = Overloaded.retry_after_for(lag, threshold_ms)
        raise Overloaded(
            f"the server is {lag} ms behind on releasing due messages (more than "
            f"[dispatch] overload_lag_ms = {threshold_ms}); nothing was stored: retry after "
            f"{retry_after_s} s, or send more slowly",
            retry_after_s=retry_after_s,
            release_lag_ms=lag,
        )
