"""The dispatcher: sleeps until the next due time (or until woken by an earlier arrival), claims
the due messages from the store, and hands them to their destinations.

- Local queues are released in one store transaction per batch (exactly-once).
- Other destinations go through their ``Transport``; the message leaves the store only after the
  destination accepted it (at-least-once; the same ``id`` on every attempt).
- A failed delivery is counted; it is retried after a back-off up to ``number_of_retries`` times
  and then moved to the error queue. A permanent failure (no such queue) goes there at once.
- Store, fetch and dispatch faults feed circuit breakers; the loop waits as the breaker says and
  recovers by itself when the fault clears.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tarry.config import DispatchConfig
from tarry.dispatch.backoff import compute_backoff_ms
from tarry.dispatch.breaker import Breakers
from tarry.errors import DeliveryFailed, TarryError
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.model.time import Clock
from tarry.store.base import DelayedStore
from tarry.transports.base import Transport

__all__ = ["Dispatcher", "LocalRelease"]

log = logging.getLogger(__name__)

#: Releases a batch into local queues in one transaction; returns the messages it could not
#: place, each with the reason.
LocalRelease = Callable[[Sequence[Message]], Awaitable[list[tuple[Message, DeliveryFailed]]]]
#: Ends a message that cannot be delivered (error queue or discard), with the failure recorded.
GiveUp = Callable[[Message, DeliveryFailed], Awaitable[None]]
#: Tells listeners (journal, metrics) about a change made here.
Notify = Callable[[str, Message, int, str | None, str | None], None]


@dataclass(slots=True)
class DispatchStats:
    rounds: int = 0
    released: int = 0
    delivered: int = 0
    failures: int = 0
    gave_up: int = 0


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
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._breakers = breakers
        self._is_local = is_local
        self._transport_for = transport_for
        self._release_local = release_local
        self._give_up = give_up
        self._notify = notify
        self._wake = asyncio.Event()
        #: When the loop plans to look next (ms); an arrival due earlier wakes it.
        self._planned_ms: int | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.stats = DispatchStats()

    def notify_due(self, deliver_at_ms: int) -> None:
        """A message due at ``deliver_at_ms`` was stored: wake the loop if that is earlier than
        the time it sleeps until."""
        if self._planned_ms is None or deliver_at_ms < self._planned_ms:
            self._wake.set()

    async def run(self) -> None:
        while True:
            # Cleared before looking, never after: an arrival noticed while we look (and
            # before we sleep) leaves the event set, so the sleep below returns at once.
            self._wake.clear()
            try:
                busy = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a fetch/store fault: wait as the breaker says, then retry
                wait_ms = self._breakers.fetch.failure(exc)
                log.warning("dispatch round failed: %s", exc)
                await self._sleep_until(self._clock.now_ms() + wait_ms)
                continue
            if not busy:
                await self._sleep_until(await self._next_wake_ms())

    async def drain(self) -> None:
        """Wait for deliveries already handed to external transports."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _next_wake_ms(self) -> int:
        now = self._clock.now_ms()
        cap = now + self._config.max_sleep_ms
        next_due = await self._store.next_due_time()
        self._breakers.fetch.success()
        return cap if next_due is None else min(next_due, cap)

    async def _sleep_until(self, wake_ms: int) -> None:
        self._planned_ms = wake_ms
        delay_ms = wake_ms - self._clock.now_ms()
        if delay_ms > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), delay_ms / 1000)
            except TimeoutError:
                pass
        self._planned_ms = None

    async def run_once(self) -> bool:
        """One fetch-and-hand-over; True when it found due messages (look again at once)."""
        now = self._clock.now_ms()
        due = await self._store.fetch_due(
            now, limit=self._config.batch_size, lease_ms=self._config.lease_ms
        )
        self._breakers.fetch.success()
        if not due:
            return False
        self.stats.rounds += 1
        local = [m for m in due if self._is_local(m.destination)]
        external = [m for m in due if not self._is_local(m.destination)]
        if local:
            await self._hand_local(local)
        for message in external:
            transport = self._transport_for(message.destination)
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
            task = asyncio.get_running_loop().create_task(self._deliver(transport, message))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        return True

    async def _hand_local(self, batch: Sequence[Message]) -> None:
        try:
            refused = await self._release_local(batch)
        except TarryError as exc:
            # The store could not commit: the claims lapse and the batch is tried again.
            wait_ms = self._breakers.store.failure(exc)
            release = getattr(self._store, "release_claims", None)
            if release is not None:
                release([m.id for m in batch])
            await asyncio.sleep(wait_ms / 1000)
            return
        self._breakers.store.success()
        self.stats.released += len(batch) - len(refused)
        for message, error in refused:
            await self._failed(message, error)

    async def _deliver(self, transport: Transport, message: Message) -> None:
        try:
            await transport.deliver(message)
        except DeliveryFailed as exc:
            self._breakers.dispatch.failure(exc)
            await self._failed(message, exc)
            return
        except Exception as exc:  # a transport bug must not kill the loop
            log.exception("transport raised an unexpected error")
            await self._failed(message, DeliveryFailed(str(exc), reason="transport_error"))
            return
        self._breakers.dispatch.success()
        now = self._clock.now_ms()
        try:
            await self._store.remove([message.id], state=MessageState.DELIVERED, now_ms=now)
        except TarryError as exc:
            # Delivered but not removed: it will be delivered again (at-least-once, same id).
            self._breakers.store.failure(exc)
            return
        self.stats.delivered += 1
        message.state = MessageState.DELIVERED
        self._notify("delivered", message, now, None, None)

    async def _failed(self, message: Message, error: DeliveryFailed) -> None:
        """Count the failure; retry after a back-off, or give up to the error queue."""
        self.stats.failures += 1
        now = self._clock.now_ms()
        attempts = message.failures + 1
        permanent = bool(error.details.get("permanent"))
        try:
            if permanent or attempts > self._config.number_of_retries:
                message.failures = attempts
                message.last_error = f"{error.reason}: {error.message}"
                await self._give_up(message, error)
                self.stats.gave_up += 1
                return
            retry_at = now + compute_backoff_ms(
                attempts,
                base_ms=self._config.retry_backoff_ms,
                max_ms=self._config.retry_backoff_max_ms,
            )
            await self._store.record_failure(
                message.id, error=f"{error.reason}: {error.message}", retry_at_ms=retry_at
            )
            self._notify("failed", message, now, None, error.reason)
            self.notify_due(retry_at)
        except TarryError as exc:
            # Even the failure handling failed: NServiceBus's failure-rate breaker.
            self._breakers.failure_handling.failure(exc)
            log.error("could not record the failure of %s: %s", message.id, exc)
