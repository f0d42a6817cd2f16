"""A route's delivery policy: how hard tarry may hit the destination and what it does when the
destination keeps failing. Pure rules, the one place that checks them (``tarry.toml``
``[routes.NAME]`` and ``PUT /v1/routes/{name}`` both come through ``parse_route_policy``).

Fields (each optional; unset means "no limit" or "the ``[dispatch]`` default"):

- ``rate_per_s``: most deliveries started per second (a token bucket holding one token, so
  deliveries are spaced ``1/rate_per_s`` apart and no second ever sees more than the rate);
- ``concurrency``: most deliveries under way at once. An HTTP route always has one (default
  ``DEFAULT_HTTP_CONCURRENCY``, its connection pool): a burst of due messages larger than the
  pool would otherwise wait inside the HTTP client and time out there, failing every one;
- ``retries``: attempts after the first before the message is dead-lettered (overrides
  ``[dispatch] number_of_retries``);
- ``retry_backoff_ms`` / ``retry_backoff_max_ms``: the first retry's delay, doubling per attempt
  up to the maximum (override ``[dispatch]``'s of the same names);
- ``retry_jitter``: each retry delay is spread by ± this fraction (default 0.2), so a receiver
  that failed many messages at once is not hit by all their retries at once;
- ``on_failure_report_to``: a queue, topic or route that gets a report (JSON) when a message for
  this route is dead-lettered;
- ``dead_letter_to``: the queue a message for this route goes to when it is dead-lettered
  (instead of ``[dispatch] error_queue``, which every tenant's failures share), so a tenant
  reads its own failures; a name that is no declared queue when a message dies falls back to
  the error queue (a failure is never dropped).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tarry.errors import InvalidArgument
from tarry.model.validate import check_name

__all__ = [
    "FAILURE_REPORT_HEADER",
    "POLICY_FIELDS",
    "RoutePolicy",
    "failure_report",
    "parse_route_policy",
]

#: Bounds, inclusive: what a receiver could want, and what keeps the arithmetic sane.
MAX_RATE_PER_S = 100_000.0
MAX_CONCURRENCY = 10_000
MAX_RETRIES = 1_000
MAX_BACKOFF_MS = 7 * 86_400_000
DEFAULT_JITTER = 0.2
#: An HTTP route's cap on deliveries under way when it sets none: its connection pool's size.
DEFAULT_HTTP_CONCURRENCY = 100

#: Header marking a failure report; a report's own failure is never reported (no loops).
FAILURE_REPORT_HEADER = "tarry-failure-report"

#: The policy's fields, in the order errors and docs list them.
POLICY_FIELDS = (
    "rate_per_s",
    "concurrency",
    "retries",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "retry_jitter",
    "on_failure_report_to",
    "dead_letter_to",
)


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """A route's delivery policy, checked (see the module docstring for each field)."""

    rate_per_s: float | None = None
    concurrency: int | None = None
    retries: int | None = None
    retry_backoff_ms: int | None = None
    retry_backoff_max_ms: int | None = None
    retry_jitter: float = DEFAULT_JITTER
    on_failure_report_to: str | None = None
    dead_letter_to: str | None = None

    @property
    def limited(self) -> bool:
        """Deliveries to this route go through its own lane (a rate or a concurrency cap)."""
        return self.rate_per_s is not None or self.concurrency is not None


def _number(data: Mapping[str, Any], key: str, *, whole: bool) -> float | int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "a whole number" if whole else "a number"
        raise InvalidArgument(f"{key} must be {kind}, not {value!r}")
    if whole and isinstance(value, float):
        if not value.is_integer():
            raise InvalidArgument(f"{key} must be a whole number, not {value!r}")
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{key} must be a finite number, not {value!r}")
    return value


def _bounded(
    data: Mapping[str, Any], key: str, low: float, high: float, *, whole: bool, hint: str
) -> Any:
    value = _number(data, key, whole=whole)
    if value is not None and not low <= value <= high:
        raise InvalidArgument(f"{key} ({value}) must be between {low:g} and {high:g}; {hint}")
    return value


def parse_route_policy(
    data: Mapping[str, Any], *, route: str | None = None, default_concurrency: int | None = None
) -> RoutePolicy:
    """The policy fields of a route's settings, checked. Raises ``invalid_argument`` naming the
    field and what to change. ``route`` is the route's own name, when known;
    ``default_concurrency`` applies when ``concurrency`` is not given."""
    rate = _bounded(
        data,
        "rate_per_s",
        1e-3,
        MAX_RATE_PER_S,
        whole=False,
        hint="leave it out for no rate limit (0.5 means one delivery every 2 s)",
    )
    concurrency = _bounded(
        data,
        "concurrency",
        1,
        MAX_CONCURRENCY,
        whole=True,
        hint="leave it out for the default (HTTP routes: 100; RabbitMQ routes: no cap)",
    )
    retries = _bounded(
        data, "retries", 0, MAX_RETRIES, whole=True, hint="0 dead-letters after the first failure"
    )
    backoff = _bounded(
        data,
        "retry_backoff_ms",
        0,
        MAX_BACKOFF_MS,
        whole=True,
        hint="it is the first retry's delay, in milliseconds",
    )
    backoff_max = _bounded(
        data,
        "retry_backoff_max_ms",
        0,
        MAX_BACKOFF_MS,
        whole=True,
        hint="it caps the doubling retry delay, in milliseconds",
    )
    if backoff is not None and backoff_max is not None and backoff_max < backoff:
        raise InvalidArgument(
            f"retry_backoff_max_ms ({backoff_max}) is shorter than retry_backoff_ms ({backoff}); "
            "raise retry_backoff_max_ms or lower retry_backoff_ms"
        )
    jitter = _bounded(
        data,
        "retry_jitter",
        0,
        1,
        whole=False,
        hint="it is a fraction: 0.2 spreads each retry delay by ±20%",
    )
    report_to = _name(data, "on_failure_report_to", "a queue, topic or route name")
    if route is not None and report_to == route:
        raise InvalidArgument(
            f"route {route!r} cannot report its failures to itself; name a queue (for "
            "example tarry.error) or another route in on_failure_report_to"
        )
    dead_letter_to = _name(data, "dead_letter_to", "a queue name")
    return RoutePolicy(
        rate_per_s=None if rate is None else float(rate),
        concurrency=default_concurrency if concurrency is None else concurrency,
        retries=retries,
        retry_backoff_ms=backoff,
        retry_backoff_max_ms=backoff_max,
        retry_jitter=DEFAULT_JITTER if jitter is None else float(jitter),
        on_failure_report_to=report_to,
        dead_letter_to=dead_letter_to,
    )


def _name(data: Mapping[str, Any], field: str, what: str) -> str | None:
    """The optional name ``field`` of ``data``, checked as tarry names are."""
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be {what}, not {value!r}")
    check_name(value, field=field)
    return value


def failure_report(
    *,
    message_id: str,
    destination: str,
    attempts: int,
    reason: str,
    error: str,
    message_ids: Mapping[str, str | None],
    now_ms: int,
) -> dict[str, Any]:
    """The send request (no destination yet) of the report ``on_failure_report_to`` gets when a
    message for the route ``destination`` is dead-lettered after ``attempts`` attempts. Its
    ``message_id`` is derived from the original's id, so a report sent again (a node died
    between the report and the dead-lettering) is kept once."""
    body = {
        "report": "delivery_failed",
        "id": message_id,
        "destination": destination,
        "attempts": attempts,
        "reason": reason,
        "error": error[:2000],
        "message_id": message_ids.get("message_id"),
        "correlation_id": message_ids.get("correlation_id"),
        "time": now_ms,
    }
    return {
        "body": json.dumps(body, separators=(",", ":")),
        "headers": {
            FAILURE_REPORT_HEADER: "delivery_failed",
            "tarry-original-id": message_id,
            "content-type": "application/json",
        },
        "message_id": f"failure-report:{message_id}",
        "correlation_id": message_ids.get("correlation_id") or message_id,
    }
