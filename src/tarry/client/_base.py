"""What the sync and async clients share: building requests, reading responses, mapping errors.
The two clients only send what this module builds."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from tarry.client._types import MessageInfo, Page, QueueInfo, Received, ReceivedBatch, Scheduled
from tarry.errors import Overloaded, TarryError, Unavailable
from tarry.model.time import parse_duration_ms, parse_instant_ms

__all__ = ["Call", "body_fields", "raise_for_error"]

DEFAULT_URL = "http://127.0.0.1:7420"
Duration = int | str | timedelta
Instant = int | str | datetime


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP call and how to read its answer."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None


def duration_ms(value: Duration | None, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    return parse_duration_ms(value, field=field)


def instant_ms(value: Instant | None, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{field} needs a time zone (use datetime.now(timezone.utc))")
        return int(value.timestamp() * 1000)
    return parse_instant_ms(value, field=field)


def body_fields(body: str | bytes) -> dict[str, str]:
    """``body`` as UTF-8 text, or ``body_base64`` when the bytes are not text."""
    if isinstance(body, str):
        return {"body": body}
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode("ascii")}


def raise_for_error(response: httpx.Response) -> None:
    """Raise the ``TarryError`` subclass named by an error body's code."""
    if response.status_code < 400:
        return
    try:
        error = TarryError.from_dict(response.json()["error"])
    except Exception:
        raise TarryError(f"HTTP {response.status_code}: {response.text[:200]}") from None
    retry_after = response.headers.get("retry-after", "")
    if isinstance(error, Overloaded) and retry_after.isdigit():
        # The header is the answer's word on when to come back (the body says the same).
        error.details["retry_after_s"] = int(retry_after)
    raise error


def unreachable(url: str, exc: Exception) -> Unavailable:
    return Unavailable(f"cannot reach tarry at {url}: {exc}; is `tarry serve` running?")


def auth_headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def tls_verify(ca: str | Path | None) -> ssl.SSLContext | bool:
    """What an https server's certificate is checked against: the system's trusted CAs, or
    the PEM file ``ca`` (a private CA or a self-signed certificate)."""
    return ssl.create_default_context(cafile=str(ca)) if ca is not None else True


# --- readers: turn a decoded body into the client's value types -----------------------------------
def read_scheduled(data: dict[str, Any]) -> Scheduled:
    return Scheduled.from_json(data)


def read_batch(data: dict[str, Any]) -> list[Scheduled | TarryError]:
    out: list[Scheduled | TarryError] = []
    for item in data["results"]:
        if "error" in item:
            out.append(TarryError.from_dict(item["error"]))
        else:
            out.append(Scheduled.from_json(item))
    return out


def read_page(data: dict[str, Any]) -> Page:
    return Page([MessageInfo.from_json(m) for m in data["items"]], data.get("next_cursor"))


def read_received(data: dict[str, Any]) -> ReceivedBatch:
    taken = [Received.from_json(m) for m in data["messages"]]
    return ReceivedBatch(taken, acked=data.get("acked"), unknown=data.get("unknown") or ())


def read_queue(data: dict[str, Any]) -> QueueInfo:
    return QueueInfo.from_json(data)


def list_params(**filters: Any) -> dict[str, Any]:
    params = {k: v for k, v in filters.items() if v is not None}
    for key in ("due_after", "due_before"):
        if key in params:
            params[key] = str(instant_ms(params[key], key))
    return params


def receive_body(
    max: int, wait: Duration | None, visibility: Duration | None, ack: Sequence[str] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"max": max, "wait_ms": duration_ms(wait, "wait") or 0}
    visibility_ms = duration_ms(visibility, "visibility")
    if visibility_ms is not None:
        body["visibility_ms"] = visibility_ms
    if ack is not None:
        body["ack"] = [*ack]
    return body


def queue_args(
    *,
    message_ttl: Duration | None = None,
    expires: Duration | None = None,
    dead_letter_to: str | None = None,
    max_length: int | None = None,
    overflow: str | None = None,
    max_message_bytes: int | None = None,
    put_enabled: bool | None = None,
) -> dict[str, Any]:
    args = {
        "message_ttl_ms": duration_ms(message_ttl, "message_ttl"),
        "expires_ms": duration_ms(expires, "expires"),
        "dead_letter_to": dead_letter_to,
        "max_length": max_length,
        "overflow": overflow,
        "max_message_bytes": max_message_bytes,
        "put_enabled": put_enabled,
    }
    return {k: v for k, v in args.items() if v is not None}


def reschedule_body(delay: Duration | None, deliver_at: Instant | None) -> dict[str, Any]:
    if delay is not None:
        return {"delay_ms": duration_ms(delay, "delay")}
    return {"deliver_at": instant_ms(deliver_at, "deliver_at")}
