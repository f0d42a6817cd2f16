"""Per-route lanes: each route with a rate limit or a concurrency cap gets its own small queue of
claimed messages and its own worker, so a slow or limited route never holds up the dispatcher's
release of other destinations. Every HTTP route has one: its ``concurrency`` defaults to its
connection pool's size, so a burst waits here rather than inside the HTTP client.

How a due message for such a route moves:

1. The dispatcher claims it (``fetch_due``) and hands it to ``RouteLanes.take``.
2. If the route's lane has room (about ``horizon_ms`` of deliveries at its pace), the message
   waits there; the lane's worker starts it when the rate (``rate_per_s``: a token bucket for
   even spacing and a window limit so the rate holds as the receiver counts, see
   ``limiter.py``) and the cap (``concurrency``) allow. Messages in a lane do not count
   against the dispatcher's in-flight bound, so the dispatcher keeps fetching and releasing
   other destinations.
3. If the lane is full, the message goes back to the store, held (``hold_claims``, no attempt
   counted) until about when the lane will have room: each such message reserves the next free
   slot, so a backlog comes back spread out at the lane's pace, not all at once.
4. A route that answered ``Retry-After`` (429/503) is paused: nothing starts before that time;
   the lane's waiting messages go back to the store held until then, and so does anything
   offered meanwhile (routes without a limit are paused the same way).

A message never waits in a lane longer than ``max_wait_ms`` (half the claim's lease): past that
it goes back to the store, so its claim cannot lapse while it waits and let a second delivery
start (a receiver slower than the lane estimated).

Rate and concurrency are per node: on PostgreSQL with several nodes each applies them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from tarry.dispatch.limiter import Slot, TokenBucket, WindowLimit
from tarry.model.message import Message
from tarry.model.route_policy import RoutePolicy
from tarry.model.time import Clock, wait_at_most
from tarry.transports.base import Transport

__all__ = ["RouteLane", "RouteLanes"]

log = logging.getLogger(__name__)

#: Starts one delivery and settles it (the dispatcher's ``_deliver``).
Deliver = Callable[[Transport, Message], Coroutine[Any, Any, None]]
#: Puts claimed messages back in the store until a time, counting no attempt.
Hold = Callable[[Sequence[Message], int], None]

#: Before a concurrency-capped route has answered, assume a delivery takes this long.
INITIAL_LATENCY_MS = 10.0
#: Completions remembered to measure how fast a lane actually drains.
PACE_SAMPLES = 64
#: Most messages one lane keeps waiting, however fast the route is.
MAX_QUEUED = 1_000


class RouteLane:
    """One route's waiting messages and the worker that starts them as its policy allows."""

    def __init__(
        self,
        name: str,
        policy: RoutePolicy,
        *,
        clock: Clock,
        deliver: Deliver,
        hold: Hold,
        horizon_ms: int = 1_000,
        max_wait_ms: int = 15_000,
    ) -> None:
        self.name = name
        self._clock = clock
        self._deliver = deliver
        self._hold = hold
        self.horizon_ms = horizon_ms
        self.max_wait_ms = max_wait_ms
        self.paused_until_ms = 0
        #: Waiting messages with the time each came in.
        self._queue: deque[tuple[Message, int]] = deque()
        self._transport: Transport | None = None
        self.active = 0
        #: The most deliveries ever under way at once (tests and ``stats``).
        self.peak_active = 0
        self._latency_ms = INITIAL_LATENCY_MS
        self._finished: deque[int] = deque(maxlen=PACE_SAMPLES)
        #: The next free slot handed to a message sent back to the store (``_reserve``).
        self._reserved_ms = 0.0
        self._poke = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.policy = policy
        self.bucket: TokenBucket | None = None
        self.window: WindowLimit | None = None
        self.update(policy)

    def update(self, policy: RoutePolicy) -> None:
        """Apply a changed policy (a route replaced at run time); waiting messages stay."""
        old = self.bucket
        self.policy = policy
        if policy.rate_per_s is None:
            self.bucket = self.window = None
        elif old is None or old.rate_per_s != policy.rate_per_s:
            self.bucket = TokenBucket(policy.rate_per_s, clock=self._clock)
            self.window = WindowLimit.for_rate(policy.rate_per_s, clock=self._clock)
        self._poke.set()

    @property
    def limited(self) -> bool:
        return self.policy.limited

    @property
    def queued(self) -> int:
        return len(self._queue)

    def interval_ms(self) -> float:
        """Expected time between two starts at the lane's pace."""
        pace = 0.0
        if self.policy.rate_per_s is not None:
            pace = 1000.0 / self.policy.rate_per_s
        if self.policy.concurrency is not None:
            # The cap's pace if every slot is busy, or the pace the lane was measured to drain
            # at, whichever is faster: a guess too slow leaves the lane idle while its
            # backlog is held back; too fast only fetches a message again a little early.
            capped = self._latency_ms / self.policy.concurrency
            done = self._finished
            if len(done) >= 8 and done[-1] > done[0]:
                capped = min(capped, (done[-1] - done[0]) / (len(done) - 1))
            pace = max(pace, capped)
        return pace

    def capacity(self) -> int:
        """How many may wait here: about ``horizon_ms`` of deliveries at the lane's pace."""
        interval = self.interval_ms()
        if interval <= 0:
            return MAX_QUEUED
        return max(1, min(MAX_QUEUED, math.floor(self.horizon_ms / interval)))

    def _reserve(self, now_ms: int) -> int:
        """A time to hold a message until: the next slot after the ones already handed out,
        brought forward by half the time the lane's queue takes to drain, so it is back while
        the lane still has work (and, spread one interval apart, the backlog comes back in
        order at the lane's pace rather than all at once)."""
        interval = self.interval_ms()
        start = max(float(now_ms), float(self.paused_until_ms))
        if self.limited:
            start = max(start, now_ms + len(self._queue) * interval)
        slot = max(self._reserved_ms, start)
        self._reserved_ms = slot + interval
        if slot <= self.paused_until_ms:
            return self.paused_until_ms
        lead = self.capacity() * interval / 2
        return max(now_ms + 1, math.ceil(slot - lead))

    def offer(self, message: Message, transport: Transport) -> bool:
        """Take ``message`` (True: it waits here or went back to the store held) or leave it
        to the caller (False: an unlimited route that is not paused)."""
        now = self._clock.now_ms()
        self._transport = transport
        if self.paused_until_ms > now:
            self._hold([message], self._reserve(now))
            return True
        if not self.limited:
            return False
        if len(self._queue) >= self.capacity():
            self._hold([message], self._reserve(now))
            return True
        self._queue.append((message, now))
        self._ensure_worker()
        self._poke.set()
        return True

    def pause(self, until_ms: int) -> None:
        """The route asked for nothing before ``until_ms`` (``Retry-After``)."""
        if until_ms <= self.paused_until_ms:
            return
        self.paused_until_ms = until_ms
        self._reserved_ms = float(until_ms)
        log.info("route %s paused until %d (Retry-After)", self.name, until_ms)
        self._send_back()
        self._poke.set()

    def _send_back(self) -> None:
        """Return every waiting message to the store, held until its reserved slot."""
        now = self._clock.now_ms()
        waiting = [m for m, _ in self._queue]
        self._queue.clear()
        for message in waiting:
            self._hold([message], self._reserve(now))

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(
                self._work(), name=f"tarry-lane-{self.name}"
            )

    async def _work(self) -> None:
        while self._queue:
            self._poke.clear()
            now = self._clock.now_ms()
            wait_ms = self._next_wait_ms(now)
            if wait_ms > 0:
                await wait_at_most(self._poke, self._clock.seconds_until(now + wait_ms))
                continue
            if self.bucket is not None and not self.bucket.try_take():
                continue
            message, _ = self._queue.popleft()
            self._start(message, self.window.start() if self.window is not None else None)

    def _next_wait_ms(self, now_ms: int) -> int:
        """0 when the head may start now; else how long to wait (or until poked)."""
        # Messages wait in arrival order, so the ones waiting too long are at the head. The
        # route is slower than the lane planned: give them back before their claims lapse
        # (which would let another round deliver them a second time).
        while self._queue and now_ms - self._queue[0][1] > self.max_wait_ms:
            message, _ = self._queue.popleft()
            self._hold([message], now_ms + 1)
        if not self._queue:
            return 0
        if self.paused_until_ms > now_ms:
            self._send_back()
            return 0
        if self.policy.concurrency is not None and self.active >= self.policy.concurrency:
            return self.max_wait_ms  # until a delivery ends (it pokes)
        if self.window is not None:
            wait = self.window.wait_ms()
            if wait is None:
                return self.max_wait_ms  # until a delivery ends (it pokes)
            if wait > 0:
                return wait
        if self.bucket is not None:
            return self.bucket.wait_ms()
        return 0

    def _start(self, message: Message, slot: Slot | None) -> None:
        transport = self._transport
        assert transport is not None  # set by the offer that queued the message
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        started = self._clock.now_ms()
        task = asyncio.get_running_loop().create_task(self._deliver(transport, message))
        self._running.add(task)

        window = self.window

        def done(finished: asyncio.Task[None]) -> None:
            self._running.discard(finished)
            self.active -= 1
            if slot is not None and window is not None:
                window.end(slot)
            now = self._clock.now_ms()
            self._finished.append(now)
            took = max(1, now - started)
            self._latency_ms = 0.8 * self._latency_ms + 0.2 * took
            self._poke.set()

        task.add_done_callback(done)

    async def drain(self) -> None:
        """Stop: waiting messages go back to the store (claims released), deliveries under way
        finish."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        now = self._clock.now_ms()
        waiting = [m for m, _ in self._queue]
        self._queue.clear()
        if waiting:
            self._hold(waiting, now)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def idle(self) -> None:
        """Wait until nothing waits here and nothing is under way (tests, benchmarks)."""
        while self._queue or self._running:
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)
            else:
                await asyncio.sleep(0.001)


class RouteLanes:
    """The lanes of the routes that have one, made when first needed."""

    def __init__(
        self,
        *,
        clock: Clock,
        policy_for: Callable[[str], RoutePolicy | None],
        deliver: Deliver,
        hold: Hold,
        max_wait_ms: int,
    ) -> None:
        self._clock = clock
        self._policy_for = policy_for
        self._deliver = deliver
        self._hold = hold
        self._max_wait_ms = max_wait_ms
        self.lanes: dict[str, RouteLane] = {}

    def _lane(self, destination: str, *, create: bool) -> RouteLane | None:
        policy = self._policy_for(destination) or RoutePolicy()
        lane = self.lanes.get(destination)
        if lane is None:
            if not (create or policy.limited):
                return None
            lane = self.lanes[destination] = RouteLane(
                destination,
                policy,
                clock=self._clock,
                deliver=self._deliver,
                hold=self._hold,
                max_wait_ms=self._max_wait_ms,
            )
        elif lane.policy != policy:
            lane.update(policy)
        return lane

    def take(self, message: Message, transport: Transport) -> bool:
        """True when the route's lane took ``message`` (queued, or held back in the store);
        False: deliver it at once as usual."""
        lane = self._lane(message.destination, create=False)
        return lane is not None and lane.offer(message, transport)

    def pause(self, destination: str, until_ms: int) -> None:
        lane = self._lane(destination, create=True)
        assert lane is not None
        lane.pause(until_ms)

    def paused_until_ms(self, destination: str) -> int:
        lane = self.lanes.get(destination)
        return lane.paused_until_ms if lane is not None else 0

    async def drain(self) -> None:
        await asyncio.gather(*(lane.drain() for lane in self.lanes.values()))

    async def idle(self) -> None:
        for lane in list(self.lanes.values()):
            await lane.idle()
