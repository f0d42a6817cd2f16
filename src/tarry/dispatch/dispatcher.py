"""The dispatcher: sleeps until the next due time (or until woken by an earlier arrival), claims
the due messages from the store, and hands them to their destinations.

- Local queues are released in one store transaction per batch (exactly-once); where the store
  allows it (``release_due``: PostgreSQL), fetching is part of that same transaction. The loop
  does not wait for a batch's transaction and markers before it looks for the next due messages
  (the batch stays claimed until then): a round that waited behind a consumer's transaction or
  a producer's fsync made everything falling due meanwhile late, and the event loop would sit
  idle while the queue database's thread worked.
- Other destinations go through their ``Transport``; the message leaves the store only after the
  destination accepted it (at-least-once; the same ``id`` on every attempt).
- A failed delivery is counted; it is retried after a back-off up to ``number_of_retries`` times
  and then moved to the error queue. A permanent failure (no such queue) goes there at once.
  A route's own policy (``route_policy.py``) overrides the retries and back-off, adds jitter,
  honours the route's ``Retry-After``, and reports a dead-lettered message to its
  ``on_failure_report_to``.
- A route with a rate limit or a concurrency cap (every HTTP route has one) delivers through its
  own lane (``lanes.py``): the dispatcher hands its messages over and goes on releasing other
  destinations.
- A destination that is itself away (``DeliveryFailed`` with ``outage``: RabbitMQ down or
  blocking publishers) holds the message back without counting an attempt: nothing goes to the
  error queue during an outage, and delivery resumes by itself.
- Store, fetch and dispatch faults feed circuit breakers; the loop waits as the breaker says and
  recovers by itself when the fault clears.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from tarry.config import DispatchConfig
from tarry.dispatch.breaker import Breakers
from tarry.dispatch.lag import ReleaseLag
from tarry.dispatch.lanes import RouteLanes
from tarry.dispatch.route_policy import failure_report_for, retry_at_ms
from tarry.errors import DeliveryFailed, TarryError
from tarry.model.due import DueColumns
from tarry.model.events import Event
from tarry.model.message import Message
from tarry.model.route_policy import RoutePolicy
from tarry.model.state import MessageState
from tarry.model.time import Clock, parse_retry_after_ms
from tarry.store.base import DelayedStore
from tarry.transports.base import Transport

__all__ = ["Dispatcher", "DueRelease", "LocalRelease", "ReleaseDue"]

log = logging.getLogger(__name__)

#: Releases a batch into local queues in one transaction; returns the messages it could not
#: place, each with the reason.
LocalRelease = Callable[[Sequence[Message]], Awaitable[list[tuple[Message, DeliveryFailed]]]]
#: Ends a message that cannot be delivered (error queue or discard), with the failure recorded.
GiveUp = Callable[[Message, DeliveryFailed], Awaitable[None]]
#: Tells listeners (journal, metrics) about changes made here, a batch's in one call.
Notify = Callable[[Sequence[Event]], None]
#: Sends a failure report (a send request with its destination) on behalf of a route.
ReportFailure = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class DueRelease:
    """What one ``ReleaseDue`` transaction did."""

    #: Messages moved into their local queues.
    released: int
    #: Local messages their queue refused, each with the reason (claimed, for ``_failed``).
    refused: list[tuple[Message, DeliveryFailed]]
    #: Due messages for other destinations, claimed for the transports.
    external: list[Message]
    #: The newest due time among the messages it took (first attempts; for ``ReleaseLag``).
    newest_due_ms: int | None = None


#: Where the store shares the queue database with other nodes (PostgreSQL, exactly_once):
#: fetch the due messages and release the local ones in ONE transaction (``now_ms``, ``limit``,
#: ``lease_ms``); a node dying inside it leaves nothing claimed.
ReleaseDue = Callable[[int, int, int], Awaitable[DueRelease]]


@dataclass(slots=True)
class DispatchStats:
    rounds: int = 0
    released: int = 0
    delivered: int = 0
    failures: int = 0
    gave_up: int = 0
    held: int = 0


class Dispatcher:
    def __init__(
        self,
        *,
        store: DelayedStore,
        config: DispatchConfig,
        clock: Clock,
        breakers: Breakers,
        is_local: Callable[[str], bool],
        transport_for: Callable[[str], Transport | None],
        release_local: LocalRelease,
        give_up: GiveUp,
        notify: Notify,
        policy_for: Callable[[str], RoutePolicy | None] | None = None,
        report_failure: ReportFailure | None = None,
        release_due: ReleaseDue | None = None,
        release_at_once: Callable[[Sequence[Message]], bool] | None = None,
        random_unit: Callable[[], float] = random.random,
    ) -> None:
        """``release_due``: where the store can fetch due messages and release the local ones
        in one transaction (PostgreSQL shared by nodes), that transaction; the round uses it
        instead of ``fetch_due`` and ``release_local``. ``release_at_once``: a release with
        nothing to wait for (local queues kept in memory), tried in the round before
        ``release_local`` runs in a task of its own."""
        self._store = store
        self._config = config
        self._clock = clock
        self._breakers = breakers
        self._is_local = is_local
        self._transport_for = transport_for
        self._release_local = release_local
        self._release_at_once = release_at_once
        self._give_up = give_up
        self._notify = notify
        self._policy_for = policy_for or (lambda name: None)
        self._report_failure = report_failure
        self._random_unit = random_unit
        self.lanes = RouteLanes(
            clock=clock,
            policy_for=self._policy_for,
            deliver=self._deliver,
            hold=self._hold_until,
            max_wait_ms=config.lease_ms // 2,
        )
        #: An arrival (``notify_due``) since the loop last looked: the next sleep returns at once.
        self._woken = False
        #: What the loop's sleep waits on: set by its timer or by an arrival.
        self._sleeper: asyncio.Future[None] | None = None
        #: When the loop plans to look next (ms); an arrival due earlier wakes it.
        self._planned_ms: int | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        #: Messages handed to external transports or being released locally, not yet settled.
        self._inflight_messages = 0
        #: Local releases under way (a subset of ``_inflight``).
        self._releasing: set[asyncio.Task[None]] = set()
        #: How many may be under way. Four where the store keeps its messages apart from the
        #: queue database (log, memory): a release holds its place until the store's markers
        #: are written, well after its commit, and with two the next round waited for a place
        #: under steady traffic (more than four gained nothing). The message bound in
        #: ``_round`` still caps a backlog at two full batches.
        #: One where the store shares the queue database: there the fetch and the release work
        #: on the same database, and a second batch in flight cost more than it overlapped (each
        #: fetch reads past the rows the other batch has claimed, also when the query skips
        #: them).
        self._releases_at_once = 1 if store.shares_queue_database else 4
        #: When held-back messages (destination away) may be tried again, earliest first.
        self._held: list[int] = []
        #: Where the tick after the last round that found messages ends (``run``).
        self._next_round_ms = 0
        self.stats = DispatchStats()
        #: How far behind due time releases are (intake refusal, ``/healthz``, ``/metrics``).
        self.lag = ReleaseLag(clock)
        self.release_due = release_due

    def notify_due(self, deliver_at_ms: int) -> None:
        """A message due at ``deliver_at_ms`` was stored: wake the loop if that is earlier than
        the time it sleeps until (and past the tick it waits out, see ``run``)."""
        if self._planned_ms is None or max(deliver_at_ms, self._next_round_ms) < self._planned_ms:
            self._woken = True
            _wake_up(self._sleeper)

    async def run(self) -> None:
        while True:
            # Cleared before looking: an arrival noticed while we look (and before we sleep)
            # leaves it set, so a sleep planned from what we read returns at once.
            self._woken = False
            started = self._clock.now_ms()
            try:
                # Planning the sleep reads the store too: inside the try, so a store that goes
                # away between the round and the plan is a fault to wait out, not the loop's end.
                found = await self._round()
                if found >= self._config.batch_size:
                    wake_ms = None  # a backlog: the next batch at once
                elif found:
                    # What falls due within a tick of a round that found messages waits for
                    # the next round, so that steady traffic is released in batches rather
                    # than a round per millisecond: a round costs about as much for one
                    # message as for fifty (the hand-overs between threads, the commit).
                    # Arrivals told while this round looked need no wake either: the next
                    # round reads the store, and nothing is planned from what this one read.
                    wake_ms = self._next_round_ms = started + self._config.tick_ms
                    self._woken = False
                else:
                    wake_ms = await self._next_wake_ms()
            except Exception as exc:  # a fetch/store fault: wait as the breaker says, then retry
                log.warning("dispatch round failed: %s", exc)
                await self._sleep_until(self._clock.now_ms() + self._breakers.fetch.failure(exc))
                continue
            if wake_ms is not None:
                await self._sleep_until(wake_ms)

    async def drain(self) -> None:
        """Wait for deliveries already handed to external transports and local releases; what
        waits in a route's lane goes back to the store."""
        await self.lanes.drain()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def run_once(self) -> bool:
        """One fetch-and-hand-over, returning once the local queues hold what it released;
        True when it found due messages (look again at once)."""
        found = await self._round()
        await self._released()
        return found > 0

    async def release_all_due(self) -> int:
        """Rounds as ``run`` makes them (each local release overlapping the next fetch) until
        nothing is due; returns the rounds. For tools and benchmarks that want the loop's
        throughput without its sleeping."""
        rounds = 0
        while await self._round():
            rounds += 1
        await self._released()
        return rounds

    async def _next_wake_ms(self) -> int:
        now = self._clock.now_ms()
        cap = now + self._config.max_sleep_ms
        next_due = await self._store.next_due_time()
        self._breakers.fetch.success()
        wake = cap if next_due is None else min(next_due, cap)
        log.debug("next due %s, held %s", next_due, self._held[:3])
        # Held messages are still claimed, so next_due_time does not see them.
        while self._held and self._held[0] <= now:
            heapq.heappop(self._held)
        return min(wake, self._held[0]) if self._held else wake

    async def _sleep_until(self, wake_ms: int) -> None:
        """Until ``wake_ms`` or an earlier arrival. A future and a timer, not a timeout around
        an ``asyncio.Event``: the loop sleeps between most rounds, and a timeout ends its wait
        by cancelling it (an exception raised and caught at every round)."""
        self._planned_ms = wake_ms
        self.lag.sleeping(wake_ms)
        delay = self._clock.seconds_until(wake_ms)
        try:
            if delay > 0 and not self._woken:
                loop = asyncio.get_running_loop()
                self._sleeper = loop.create_future()
                timer = loop.call_later(delay, _wake_up, self._sleeper)
                try:
                    await self._sleeper
                finally:
                    timer.cancel()
                    self._sleeper = None
        finally:
            self._planned_ms = None
            self.lag.awake()

    async def _released(self) -> None:
        """Wait for the local releases under way; what killed one (the process exiting)
        reaches the caller."""
        if self._releasing:
            await asyncio.gather(*self._releasing)

    async def _round(self) -> int:
        """One fetch-and-hand-over; local releases are left running (``_releasing``). How many
        due messages it found and handed on (0: none, or only ones held back)."""
        # Back-pressure: claim no more while two batches are still out with slow destinations,
        # so a burst neither outlives its claims nor turns into a pile of confirm timeouts.
        # A bounded number of local releases (``_releases_at_once``); a failing store, whose
        # releases each wait out the breaker, is not asked again meanwhile.
        while (
            self._inflight_messages >= 2 * self._config.batch_size
            or len(self._releasing) >= self._releases_at_once
        ):
            await asyncio.wait(set(self._inflight), return_when=asyncio.FIRST_COMPLETED)
        now = self._clock.now_ms()
        if self.release_due is not None:
            outcome = await self.release_due(now, self._config.batch_size, self._config.lease_ms)
            self._breakers.fetch.success()
            found = outcome.released + len(outcome.refused) + len(outcome.external)
            self.lag.round_found(
                found, full=found >= self._config.batch_size, newest_due_ms=outcome.newest_due_ms
            )
            if not found:
                return 0
            self._breakers.store.success()
            self.stats.rounds += 1
            self.stats.released += outcome.released
            for message, error in outcome.refused:
                await self._failed(message, error)
            external = outcome.external
        else:
            due = await self._store.fetch_due(
                now, limit=self._config.batch_size, lease_ms=self._config.lease_ms
            )
            self._breakers.fetch.success()
            log.debug("fetched %d due at %d", len(due), now)
            found = len(due)
            self.lag.round_found(
                found,
                full=found >= self._config.batch_size,
                newest_due_ms=max(self.lag.due_times(due), default=None),
            )
            if not found:
                return 0
            self.stats.rounds += 1
            local, external = self._split(due)
            if local and not self._released_at_once(local):
                self._spawn_release(local)
            if found >= self._config.batch_size:
                # A turn for the loop before the next fetch, which a full round makes at once
                # (a round does not otherwise give one): a release in a task starts (hands its
                # transaction to the database thread; two would wait and commit together, the
                # thread idle while we fetch), and a backlog released at once does not hold
                # the loop from requests round after round. A round that found less sleeps.
                await asyncio.sleep(0)
        batched: dict[str, list[Message]] = {}
        held_before, laned = self.stats.held, 0
        for message in external:
            transport = self._transport_for(message.destination)
            if transport is not None and self.lanes.take(message, transport):
                laned += 1
                continue  # the route's own lane (limited or paused) has it
            if transport is not None and hasattr(transport, "deliver_batch"):
                batched.setdefault(message.destination, []).append(message)
                continue
            if transport is None:
                await self._failed(
                    message,
                    DeliveryFailed(
                        f"destination {message.destination!r} no longer exists",
                        reason="unknown_destination",
                        permanent=True,
                    ),
                )
                continue
            self._spawn(self._deliver(transport, message), (message,))
        for destination, batch in batched.items():
            self._spawn(self._deliver_batch(self._transport_for(destination), batch), batch)
        # Messages a full or paused lane sent straight back are not progress: counted as
        # found, a route's backlog would have the loop fetch them again and again at once.
        handed_on = max(0, found - (self.stats.held - held_before))
        if laned:
            # The lanes' workers start deliveries: give them a turn before the next fetch.
            await asyncio.sleep(0)
        return handed_on

    def _split(self, due: Sequence[Message]) -> tuple[Sequence[Message], list[Message]]:
        """``due`` as (the local ones, the external ones), in order. A batch read as columns
        (``DueColumns``) that goes to local queues alone (most rounds) stays as it is: its
        release writes the columns, and no ``Message`` is made for it here."""
        columns = due if isinstance(due, DueColumns) else None
        destinations = set(columns.destination) if columns is not None else None
        if destinations is None:
            destinations = {m.destination for m in due}
        # Asked once per destination, not twice per message (a batch mostly shares one).
        is_local = {d: self._is_local(d) for d in destinations}
        if all(is_local.values()):
            return due, []
        local = [m for m in due if is_local[m.destination]]
        return local, [m for m in due if not is_local[m.destination]]

    def _released_at_once(self, batch: Sequence[Message]) -> bool:
        """``batch`` released in this step (``release_at_once``), or False for a task to."""
        if self._release_at_once is None:
            return False
        try:
            if not self._release_at_once(batch):
                return False
        except Exception as exc:  # the task's failure handling: breaker, claims given back
            self._spawn_release(batch, failed=exc)
            return True
        # No store success told: this wrote nothing (its markers go with a later group), so it
        # says nothing of a disk found full; a success here closed the breaker a send opened.
        self.stats.released += len(batch)
        return True

    def _spawn_release(self, batch: Sequence[Message], failed: Exception | None = None) -> None:
        # The release keeps its own books as it ends (``_hand_local``), not in a done callback:
        # a task's done callbacks run in a loop iteration of their own, one more every round.
        token = self._track(batch)
        task = asyncio.get_running_loop().create_task(self._hand_local(batch, token, failed))
        self._inflight.add(task)
        self._releasing.add(task)

    def _spawn(
        self, work: Coroutine[Any, Any, None], batch: Sequence[Message]
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._inflight.add(task)
        messages, token = len(batch), self._track(batch)
        task.add_done_callback(lambda finished: self._untrack(finished, messages, token))
        return task

    def _track(self, batch: Sequence[Message]) -> int:
        """Count ``batch`` as in flight; returns the lag's token for ``_untrack``."""
        self._inflight_messages += len(batch)
        return self.lag.started(self.lag.due_times(batch))

    def _untrack(self, task: asyncio.Task[None] | None, messages: int, token: int) -> None:
        if task is not None:
            self._inflight.discard(task)
            self._releasing.discard(task)
        self._inflight_messages -= messages
        self.lag.finished(token)

    async def _deliver_batch(self, transport: Any, batch: list[Message]) -> None:
        """A transport that publishes many at once (RabbitMQ, pipelined confirms): the
        delivered ones leave the store in one write; each failure is handled on its own."""
        try:
            outcomes = await transport.deliver_batch(batch)
        except Exception as exc:  # a transport bug must not kill the loop
            log.exception(
                "transport raised an unexpected error",
                extra={"destination": batch[0].destination, "count": len(batch)},
            )
            failure = DeliveryFailed(str(exc), reason="transport_error")
            outcomes = [failure] * len(batch)
        delivered = [m for m, error in zip(batch, outcomes, strict=True) if error is None]
        for message, error in zip(batch, outcomes, strict=True):
            if error is not None:
                await self._not_delivered(message, error)
        if delivered:
            await self._delivered(delivered)

    async def _hand_local(
        self, batch: Sequence[Message], token: int, failed: Exception | None = None
    ) -> None:
        """A local release (``_spawn_release``), its books kept as it ends; ``failed``: what a
        release at once raised, handled as a failed release. A task cancelled before its first
        step would skip them: only the loop's shutdown cancels these."""
        try:
            try:
                if failed is not None:
                    raise failed
                refused = await self._release_local(batch)
            except Exception as exc:
                # The store could not commit: the claims lapse and the batch is tried again.
                # This task keeps its share of the in-flight limit while it waits out the
                # breaker, so a failing store stops the loop from claiming more.
                if not isinstance(exc, TarryError):
                    log.exception("local release failed unexpectedly")
                wait_ms = self._breakers.store.failure(exc)
                self._store.release_claims([m.id for m in batch])
                await asyncio.sleep(wait_ms / 1000)
                return
            self._breakers.store.success()
            self.stats.released += len(batch) - len(refused)
            for message, error in refused:
                await self._failed(message, error)
        finally:
            self._untrack(asyncio.current_task(), len(batch), token)

    async def _deliver(self, transport: Transport, message: Message) -> None:
        try:
            await transport.deliver(message)
        except DeliveryFailed as exc:
            await self._not_delivered(message, exc)
            return
        except Exception as exc:  # a transport bug must not kill the loop
            log.exception(
                "transport raised an unexpected error",
                extra={"id": message.id, "destination": message.destination},
            )
            await self._failed(message, DeliveryFailed(str(exc), reason="transport_error"))
            return
        await self._delivered([message])

    async def _not_delivered(self, message: Message, error: DeliveryFailed) -> None:
        wait_ms = self._breakers.dispatch.failure(error)
        if error.details.get("outage"):
            self._hold(message, wait_ms)
        else:
            await self._failed(message, error)

    async def _delivered(self, messages: Sequence[Message]) -> None:
        self._breakers.dispatch.success()
        now = self._clock.now_ms()
        try:
            await self._store.remove(
                [m.id for m in messages], state=MessageState.DELIVERED, now_ms=now
            )
        except TarryError as exc:
            # Delivered but not removed: it will be delivered again (at-least-once, same id).
            self._breakers.store.failure(exc)
            return
        self.stats.delivered += len(messages)
        for message in messages:
            message.state = MessageState.DELIVERED
        self._notify([("delivered", message, now, None, None) for message in messages])

    def _hold(self, message: Message, wait_ms: int) -> None:
        """The destination itself is away (RabbitMQ down or blocking): the message waits, no
        attempt is counted against it, and it is tried again after the breaker's wait."""
        self._hold_until([message], self._clock.now_ms() + max(wait_ms, 1))

    def _hold_until(self, messages: Sequence[Message], until_ms: int) -> None:
        """Put claimed messages back in the store until ``until_ms``, no attempt counted (their
        destination is away, paused, or its lane is full)."""
        self._store.hold_claims([m.id for m in messages], until_ms=until_ms)
        for message in messages:
            self.lag.held(message.id, until_ms)
        now = self._clock.now_ms()
        while self._held and self._held[0] <= now:  # passed: only the future ones matter
            heapq.heappop(self._held)
        heapq.heappush(self._held, until_ms)
        log.debug("holding %d message(s) until %d", len(messages), until_ms)
        self.stats.held += len(messages)
        self.notify_due(until_ms)  # the loop may be asleep past ``until``: make it plan again

    async def _failed(self, message: Message, error: DeliveryFailed) -> None:
        """Count the failure; retry after a back-off, or give up to the error queue."""
        self.stats.failures += 1
        now = self._clock.now_ms()
        attempts = message.failures + 1
        permanent = bool(error.details.get("permanent"))
        policy = self._policy_for(message.destination)
        not_before = parse_retry_after_ms(error.details.get("retry_after"), now_ms=now)
        if not_before is not None:
            self.lanes.pause(message.destination, not_before)
        retry_at = (
            None
            if permanent
            else retry_at_ms(
                attempts=attempts,
                policy=policy,
                config=self._config,
                now_ms=now,
                random_unit=self._random_unit(),
                not_before_ms=not_before,
            )
        )
        try:
            if retry_at is None:
                message.failures = attempts
                message.last_error = f"{error.reason}: {error.message}"
                await self._report(message, error, policy, now)
                await self._give_up(message, error)
                self.stats.gave_up += 1
                log.warning(
                    "gave up delivering %s to %s after %d attempts: %s",
                    message.id,
                    message.destination,
                    attempts,
                    message.last_error,
                    extra={
                        "id": message.id,
                        "destination": message.destination,
                        "reason": error.reason,
                    },
                )
                return
            await self._store.record_failure(
                message.id, error=f"{error.reason}: {error.message}", retry_at_ms=retry_at
            )
            self._notify([("failed", message, now, None, error.reason)])
            self.notify_due(retry_at)
        except TarryError as exc:
            # Even the failure handling failed: NServiceBus's failure-rate breaker.
            self._breakers.failure_handling.failure(exc)
            log.error(
                "could not record the failure of %s: %s",
                message.id,
                exc,
                extra={"id": message.id, "destination": message.destination},
            )

    async def _report(
        self, message: Message, error: DeliveryFailed, policy: RoutePolicy | None, now: int
    ) -> None:
        """Tell the route's ``on_failure_report_to`` before dead-lettering: a node dying in
        between sends the report again when the message fails again, and the report's
        ``message_id`` (derived from the message's id) keeps it once. A report that cannot be
        sent (its destination deleted) is logged; the message is dead-lettered all the same."""
        request = failure_report_for(message, error, policy=policy, now_ms=now)
        if request is None or self._report_failure is None:
            return
        try:
            await self._report_failure(request)
        except TarryError as exc:
            log.error(
                "could not report the failure of %s to %s: %s",
                message.id,
                request["destination"],
                exc,
            )


def _wake_up(sleeper: asyncio.Future[None] | None) -> None:
    if sleeper is not None and not sleeper.done():
        sleeper.set_result(None)
