"""Circuit breakers for the store, fetch and dispatch paths (NServiceBus's
``RepeatedFailuresOverTimeCircuitBreaker``) and for failure handling (its failure-rate breaker).

No timers: the injected clock decides. A breaker armed by a failure and never disarmed by a
success reads ``triggered`` once ``time_to_trigger_ms`` has passed; a ``StorageFault`` (the disk
refused a write: full, failing) triggers it at once, since waiting will not clear that, and it
closes at the next success (a send, a release, or the engine's probe while it is open).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

from tarry.config import DispatchConfig
from tarry.errors import StorageFault, TarryError
from tarry.model.time import Clock

__all__ = ["BreakerState", "Breakers", "CircuitBreaker", "FailureRateBreaker"]

log = logging.getLogger(__name__)
OnTrigger = Callable[[str, BaseException], None]


class BreakerState(StrEnum):
    #: No failure since the last success.
    CLOSED = "closed"
    #: Failing, for less than ``time_to_trigger_ms`` so far.
    ARMED = "armed"
    #: Failing for ``time_to_trigger_ms`` or more: ``/healthz`` reports it as open.
    TRIGGERED = "triggered"


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        time_to_trigger_ms: int,
        clock: Clock,
        on_trigger: OnTrigger | None = None,
        armed_wait_ms: int = 1_000,
        triggered_wait_ms: int = 10_000,
    ) -> None:
        self.name = name
        self.time_to_trigger_ms = time_to_trigger_ms
        self._clock = clock
        self._on_trigger = on_trigger
        self.armed_wait_ms = armed_wait_ms
        self.triggered_wait_ms = triggered_wait_ms
        self.armed_since_ms: int | None = None
        self.last_error: str | None = None
        #: Triggered at once by a ``StorageFault``, until the next success.
        self.tripped = False
        self._announced = False

    @property
    def state(self) -> BreakerState:
        if self.armed_since_ms is None:
            return BreakerState.CLOSED
        if self.tripped or self._clock.now_ms() - self.armed_since_ms >= self.time_to_trigger_ms:
            return BreakerState.TRIGGERED
        return BreakerState.ARMED

    @property
    def is_open(self) -> bool:
        return self.state is BreakerState.TRIGGERED

    def failure(self, exc: BaseException) -> int:
        """Count a failure; returns how long (ms) the caller should pause before trying again."""
        self.last_error = exc.message if isinstance(exc, TarryError) else str(exc)
        if self.armed_since_ms is None:
            self.armed_since_ms = self._clock.now_ms()
            log.warning("%s breaker armed: %s", self.name, exc)
        if isinstance(exc, StorageFault) and not self.tripped:
            self.tripped = True
            if not self._announced:
                self._announced = True
                log.error("%s breaker triggered at once: %s", self.name, exc)
                if self._on_trigger is not None:
                    self._on_trigger(self.name, exc)
        failing_ms = self._clock.now_ms() - self.armed_since_ms
        if failing_ms >= self.time_to_trigger_ms:
            if not self._announced:
                self._announced = True
                log.error(
                    "%s breaker triggered after %d ms of failures: %s",
                    self.name,
                    self.time_to_trigger_ms,
                    exc,
                )
                if self._on_trigger is not None:
                    self._on_trigger(self.name, exc)
            return self.triggered_wait_ms
        # Tripped by the disk or not: retried at the armed pace, so freed space is noticed.
        return self.armed_wait_ms

    def success(self) -> None:
        if self.armed_since_ms is None:
            return
        if self.state is BreakerState.TRIGGERED:
            log.info("%s breaker recovered", self.name)
        self.armed_since_ms = None
        self.tripped = False
        self._announced = False


class FailureRateBreaker:
    """Triggers when more than ``max_failures_per_second × window`` failures fall in one window."""

    def __init__(
        self,
        name: str,
        *,
        max_failures_per_second: int,
        clock: Clock,
        window_ms: int = 30_000,
        on_trigger: OnTrigger | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._limit = max_failures_per_second * window_ms // 1000
        self._window_ms = window_ms
        self._on_trigger = on_trigger
        self._window_start_ms = clock.now_ms()
        self._count = 0
        self._triggered = False
        self.last_error: str | None = None

    def _roll(self) -> None:
        now = self._clock.now_ms()
        if now - self._window_start_ms >= self._window_ms:
            self._window_start_ms, self._count, self._triggered = now, 0, False

    @property
    def state(self) -> BreakerState:
        self._roll()
        if self._triggered:
            return BreakerState.TRIGGERED
        return BreakerState.ARMED if self._count else BreakerState.CLOSED

    @property
    def is_open(self) -> bool:
        return self.state is BreakerState.TRIGGERED

    def failure(self, exc: BaseException) -> int:
        self._roll()
        self._count += 1
        self.last_error = str(exc)
        if self._count > self._limit and not self._triggered:
            self._triggered = True
            log.error(
                "%s breaker triggered: %d failures within %d ms",
                self.name,
                self._count,
                self._window_ms,
            )
            if self._on_trigger is not None:
                self._on_trigger(self.name, exc)
        return 0

    def success(self) -> None:
        return None

    def reset(self) -> None:
        self._window_start_ms, self._count, self._triggered = self._clock.now_ms(), 0, False


class Breakers:
    """The engine's named breakers, as ``/healthz`` shows them."""

    def __init__(
        self,
        *,
        store: CircuitBreaker,
        fetch: CircuitBreaker,
        dispatch: CircuitBreaker,
        failure_handling: FailureRateBreaker,
    ) -> None:
        self.store = store
        self.fetch = fetch
        self.dispatch = dispatch
        self.failure_handling = failure_handling

    @classmethod
    def from_config(cls, config: DispatchConfig, clock: Clock) -> Breakers:
        return cls(
            store=CircuitBreaker(
                "store", time_to_trigger_ms=config.time_to_trigger_store_ms, clock=clock
            ),
            fetch=CircuitBreaker(
                "fetch", time_to_trigger_ms=config.time_to_trigger_fetch_ms, clock=clock
            ),
            dispatch=CircuitBreaker(
                "dispatch", time_to_trigger_ms=config.time_to_trigger_dispatch_ms, clock=clock
            ),
            failure_handling=FailureRateBreaker(
                "failure_handling",
                max_failures_per_second=config.maximum_recovery_failures_per_second,
                clock=clock,
            ),
        )

    def _all(self) -> list[CircuitBreaker | FailureRateBreaker]:
        return [self.store, self.fetch, self.dispatch, self.failure_handling]

    def open_names(self) -> list[str]:
        return [b.name for b in self._all() if b.is_open]

    def snapshot(self) -> dict[str, str]:
        return {b.name: b.state.value for b in self._all()}

    def reasons(self) -> dict[str, str]:
        """Why each open breaker is open: its last error (``/healthz``)."""
        return {b.name: b.last_error or "" for b in self._all() if b.is_open}
