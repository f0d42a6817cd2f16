"""What a route's delivery policy decides after a failed delivery: when to try again (per-route
retries and back-off with jitter, never before the route's ``Retry-After``), or to give up and
whom to tell. Pure: the dispatcher passes the clock's time and a random number in."""

from __future__ import annotations

from typing import Any

from tarry.config import DispatchConfig
from tarry.dispatch.backoff import compute_backoff_ms
from tarry.errors import DeliveryFailed
from tarry.model.message import Message
from tarry.model.route_policy import FAILURE_REPORT_HEADER, RoutePolicy, failure_report

__all__ = ["failure_report_for", "retry_at_ms"]


def retry_at_ms(
    *,
    attempts: int,
    policy: RoutePolicy | None,
    config: DispatchConfig,
    now_ms: int,
    random_unit: float,
    not_before_ms: int | None = None,
) -> int | None:
    """When failed attempt number ``attempts`` (1-based) may be retried, or None when the
    route's retries (default ``[dispatch] number_of_retries``) are used up. The delay doubles
    from ``retry_backoff_ms`` up to ``retry_backoff_max_ms`` and is spread by ± the route's
    ``retry_jitter`` (the global settings have none, as before); ``not_before_ms`` (the
    route's ``Retry-After``) comes first when it is later."""
    policy = policy or RoutePolicy()
    retries = config.number_of_retries if policy.retries is None else policy.retries
    if attempts > retries:
        return None
    base = config.retry_backoff_ms if policy.retry_backoff_ms is None else policy.retry_backoff_ms
    cap = (
        config.retry_backoff_max_ms
        if policy.retry_backoff_max_ms is None
        else policy.retry_backoff_max_ms
    )
    routed = policy != RoutePolicy()
    delay = compute_backoff_ms(
        attempts,
        base_ms=base,
        max_ms=max(cap, base),
        jitter=policy.retry_jitter if routed else 0.0,
        random_unit=random_unit,
    )
    at = now_ms + delay
    return at if not_before_ms is None else max(at, not_before_ms)


def failure_report_for(
    message: Message, error: DeliveryFailed, *, policy: RoutePolicy | None, now_ms: int
) -> dict[str, Any] | None:
    """The send request for the route's ``on_failure_report_to`` when ``message`` is
    dead-lettered, or None (no callback, or the message is itself a report: a report that
    cannot be delivered is not reported again, so two routes reporting to each other cannot
    loop)."""
    if policy is None or policy.on_failure_report_to is None:
        return None
    if FAILURE_REPORT_HEADER in message.headers:
        return None
    request = failure_report(
        message_id=message.id,
        destination=message.destination,
        attempts=message.failures,
        reason=error.reason,
        error=error.message,
        message_ids={"message_id": message.message_id, "correlation_id": message.correlation_id},
        now_ms=now_ms,
    )
    request["destination"] = policy.on_failure_report_to
    return request
