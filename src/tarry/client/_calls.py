"""Every client operation as a pure function: arguments in, (HTTP call, reader of the answer)
out. ``Client`` and ``AsyncClient`` turn each into a method, so both have the same surface."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tarry.client._base import (
    Call,
    Duration,
    Instant,
    body_fields,
    duration_ms,
    instant_ms,
    list_params,
    queue_args,
    read_batch,
    read_page,
    read_queue,
    read_received,
    read_scheduled,
    receive_body,
    reschedule_body,
)
from tarry.client._types import MessageInfo, Page, QueueInfo, ReceivedBatch, Scheduled
from tarry.errors import TarryError

R = TypeVar("R")
Spec = tuple[Call, Callable[[Any], R]]


def _same(data: Any) -> Any:
    return data


def send(
    destination: str,
    body: str | bytes = b"",
    *,
    delay: Duration | None = None,
    deliver_at: Instant | None = None,
    ttl: Duration | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | None = None,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    report: Iterable[str] | None = None,
    on_undeliverable: str | None = None,
    group_id: str | None = None,
    retain: bool | None = None,
    persistent: bool | None = None,
) -> Spec[Scheduled]:
    """Schedule one message; ``delay``/``ttl`` take ms, ``"5s"`` or a timedelta, ``deliver_at``
    epoch ms, RFC 3339 or an aware datetime."""
    optional = {
        "delay_ms": duration_ms(delay, "delay"),
        "deliver_at": instant_ms(deliver_at, "deliver_at"),
        "ttl_ms": duration_ms(ttl, "ttl"),
        "headers": dict(headers) if headers else None,
        "message_id": message_id,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "report": [*report] if report else None,
        "on_undeliverable": on_undeliverable,
        "group_id": group_id,
        "retain": retain,
        "persistent": persistent,
    }
    # Absent options are left out so that the server's defaults apply.
    data: dict[str, Any] = {"destination": destination, **body_fields(body)}
    data.update({k: v for k, v in optional.items() if v is not None})
    return Call("POST", "/v1/messages", json=data), read_scheduled


def send_batch(
    messages: Sequence[Mapping[str, Any]],
) -> Spec[builtins.list[Scheduled | TarryError]]:
    """Schedule many (dicts as the HTTP API takes them); each accepted or rejected on its own."""
    return Call("POST", "/v1/messages/batch", json={"messages": [*messages]}), read_batch


def get(message_id: str) -> Spec[MessageInfo]:
    """A message's metadata and state."""
    return Call("GET", f"/v1/messages/{message_id}"), MessageInfo.from_json


def cancel(message_id: str) -> Spec[dict[str, Any]]:
    """Cancel a scheduled message (``not_cancellable`` once it left ``scheduled``)."""
    return Call("DELETE", f"/v1/messages/{message_id}"), _same


def reschedule(
    message_id: str, *, delay: Duration | None = None, deliver_at: Instant | None = None
) -> Spec[MessageInfo]:
    """Move a scheduled message to ``delay`` from now or to ``deliver_at``."""
    body = reschedule_body(delay, deliver_at)
    return Call("POST", f"/v1/messages/{message_id}/reschedule", json=body), MessageInfo.from_json


def list(
    *,
    destination: str | None = None,
    correlation_id: str | None = None,
    message_id: str | None = None,
    state: str | None = None,
    due_after: Instant | None = None,
    due_before: Instant | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Spec[Page]:
    """One page of messages ordered by ``deliver_at``."""
    params = list_params(
        destination=destination,
        correlation_id=correlation_id,
        message_id=message_id,
        state=state,
        due_after=due_after,
        due_before=due_before,
        limit=limit,
        cursor=cursor,
    )
    return Call("GET", "/v1/messages", params=params), read_page


def declare_queue(
    name: str,
    *,
    message_ttl: Duration | None = None,
    expires: Duration | None = None,
    dead_letter_to: str | None = None,
    max_length: int | None = None,
    overflow: str | None = None,
    max_message_bytes: int | None = None,
    put_enabled: bool | None = None,
) -> Spec[QueueInfo]:
    """Declare a queue (idempotent for equal arguments; ``precondition_failed`` otherwise)."""
    args = queue_args(
        message_ttl=message_ttl,
        expires=expires,
        dead_letter_to=dead_letter_to,
        max_length=max_length,
        overflow=overflow,
        max_message_bytes=max_message_bytes,
        put_enabled=put_enabled,
    )
    return Call("PUT", f"/v1/queues/{name}", json=args), read_queue


def get_queue(name: str) -> Spec[QueueInfo]:
    """A queue's counts and arguments in force."""
    return Call("GET", f"/v1/queues/{name}"), read_queue


def list_queues() -> Spec[builtins.list[QueueInfo]]:
    return Call("GET", "/v1/queues"), lambda data: [read_queue(q) for q in data["items"]]


def delete_queue(name: str) -> Spec[dict[str, Any]]:
    return Call("DELETE", f"/v1/queues/{name}"), _same


def receive(
    queue: str,
    *,
    max: int = 1,
    wait: Duration | None = None,
    visibility: Duration | None = None,
    ack: Sequence[str] | None = None,
) -> Spec[ReceivedBatch]:
    """Up to ``max`` messages, waiting up to ``wait`` for the first. ``ack``: receipts of
    messages taken before, acked first (before any wait), in the same request; the answer's
    ``acked`` and ``unknown`` say what came of them."""
    body = receive_body(max, wait, visibility, ack)
    return Call("POST", f"/v1/queues/{queue}/receive", json=body), read_received


def ack(queue: str, receipts: Sequence[str]) -> Spec[dict[str, Any]]:
    return Call("POST", f"/v1/queues/{queue}/ack", json={"receipts": [*receipts]}), _same


def nack(queue: str, receipts: Sequence[str], *, requeue: bool = True) -> Spec[dict[str, Any]]:
    body = {"receipts": [*receipts], "requeue": requeue}
    return Call("POST", f"/v1/queues/{queue}/nack", json=body), _same


def redrive(
    queue: str,
    *,
    ids: Sequence[str] | None = None,
    original_destination: str | None = None,
    reason: str | None = None,
    dead_after: Instant | None = None,
    dead_before: Instant | None = None,
    to: str | None = None,
    delay: Duration | None = None,
    max: int | None = None,
    cursor: str | None = None,
) -> Spec[dict[str, Any]]:
    """Move dead letters of ``queue`` back to where each came from (or ``to``), optionally
    ``delay``ed: all, those matching the filters, or ``ids``. Answers ``{"moved", "skipped",
    "skipped_reasons", "next_cursor"}``; pass ``next_cursor`` back as ``cursor`` to go on."""
    optional = {
        "ids": [*ids] if ids is not None else None,
        "original_destination": original_destination,
        "reason": reason,
        "dead_after": instant_ms(dead_after, "dead_after"),
        "dead_before": instant_ms(dead_before, "dead_before"),
        "to": to,
        "delay_ms": duration_ms(delay, "delay"),
        "max": max,
        "cursor": cursor,
    }
    body = {k: v for k, v in optional.items() if v is not None}
    return Call("POST", f"/v1/queues/{queue}/redrive", json=body), _same


def declare_topic(name: str) -> Spec[dict[str, Any]]:
    return Call("PUT", f"/v1/topics/{name}"), _same


def subscribe(topic: str, queue: str) -> Spec[dict[str, Any]]:
    return Call("PUT", f"/v1/topics/{topic}/subscriptions/{queue}"), _same


def unsubscribe(topic: str, queue: str) -> Spec[dict[str, Any]]:
    return Call("DELETE", f"/v1/topics/{topic}/subscriptions/{queue}"), _same


def get_topic(name: str) -> Spec[dict[str, Any]]:
    return Call("GET", f"/v1/topics/{name}"), _same


def put_policy(
    name: str,
    *,
    pattern: str,
    definition: Mapping[str, Any],
    priority: int = 0,
    operator: bool = False,
    apply_to: str = "queues",
) -> Spec[dict[str, Any]]:
    body = {
        "pattern": pattern,
        "definition": dict(definition),
        "priority": priority,
        "operator": operator,
        "apply_to": apply_to,
    }
    return Call("PUT", f"/v1/policies/{name}", json=body), _same


def list_policies() -> Spec[builtins.list[dict[str, Any]]]:
    return Call("GET", "/v1/policies"), lambda data: data["items"]


def delete_policy(name: str) -> Spec[dict[str, Any]]:
    return Call("DELETE", f"/v1/policies/{name}"), _same


def list_routes() -> Spec[builtins.list[dict[str, Any]]]:
    """The routes (destinations outside tarry) this token may send to or read."""
    return Call("GET", "/v1/routes"), lambda data: data["items"]


def get_route(name: str) -> Spec[dict[str, Any]]:
    """A route's settings (secrets shown as fingerprints only)."""
    return Call("GET", f"/v1/routes/{name}"), _same


def put_schedule(
    name: str,
    *,
    cron: str,
    destination: str,
    body: str | bytes = b"",
    timezone: str = "UTC",
    headers: Mapping[str, str] | None = None,
    ttl: Duration | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    catch_up: str | None = None,
) -> Spec[dict[str, Any]]:
    """Create or replace a recurring schedule: ``cron`` (5 fields, or 6 with seconds first) in
    ``timezone`` (IANA); each occurrence is a message to ``destination`` with ``message_id``
    ``sched:{name}:{epoch ms}``. ``catch_up``: ``"skip"`` or ``"once"``. Answers with the
    schedule and its next occurrences."""
    optional = {
        "headers": dict(headers) if headers else None,
        "ttl_ms": duration_ms(ttl, "ttl"),
        "start_at": instant_ms(start_at, "start_at"),
        "end_at": instant_ms(end_at, "end_at"),
        "catch_up": catch_up,
    }
    data: dict[str, Any] = {
        "cron": cron,
        "timezone": timezone,
        "destination": destination,
        **body_fields(body),
    }
    data.update({k: v for k, v in optional.items() if v is not None})
    return Call("PUT", f"/v1/schedules/{name}", json=data), _same


def get_schedule(name: str) -> Spec[dict[str, Any]]:
    """A schedule, its next occurrences and how far they are stored."""
    return Call("GET", f"/v1/schedules/{name}"), _same


def list_schedules() -> Spec[builtins.list[dict[str, Any]]]:
    return Call("GET", "/v1/schedules"), lambda data: data["items"]


def delete_schedule(name: str) -> Spec[dict[str, Any]]:
    """Delete a schedule and cancel the occurrences it stored."""
    return Call("DELETE", f"/v1/schedules/{name}"), _same


def put_route(
    name: str,
    *,
    transport: str,
    url: str,
    secrets: Sequence[str] | None = None,
    timeout: Duration | None = None,
    headers: Mapping[str, str] | None = None,
    rate_per_s: float | None = None,
    concurrency: int | None = None,
    retries: int | None = None,
    retry_backoff: Duration | None = None,
    on_failure_report_to: str | None = None,
    **settings: Any,
) -> Spec[dict[str, Any]]:
    """Create or replace route ``name`` (in force at once); ``settings`` takes the transport's
    other fields as the HTTP API names them (``mode``, ``routing_key``, ``exchange``, ...)."""
    optional = {
        "secrets": [*secrets] if secrets is not None else None,
        "timeout_ms": duration_ms(timeout, "timeout"),
        "headers": dict(headers) if headers else None,
        "rate_per_s": rate_per_s,
        "concurrency": concurrency,
        "retries": retries,
        "retry_backoff_ms": duration_ms(retry_backoff, "retry_backoff"),
        "on_failure_report_to": on_failure_report_to,
    }
    body: dict[str, Any] = {"transport": transport, "url": url, **settings}
    body.update({k: v for k, v in optional.items() if v is not None})
    return Call("PUT", f"/v1/routes/{name}", json=body), _same


def delete_route(name: str, *, force: bool = False) -> Spec[dict[str, Any]]:
    """Delete a route put at run time: ``in_use`` while messages wait for it, unless ``force``
    (which dead-letters them; the answer's ``dead_lettered`` says how many)."""
    params = {"force": "true"} if force else None
    return Call("DELETE", f"/v1/routes/{name}", params=params), _same


def health() -> Spec[dict[str, Any]]:
    return Call("GET", "/healthz"), _same


def stats() -> Spec[dict[str, Any]]:
    return Call("GET", "/v1/stats"), _same
