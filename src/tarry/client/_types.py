"""Value types the Python client returns."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MessageInfo", "Page", "QueueInfo", "Received", "Scheduled"]


@dataclass(frozen=True, slots=True)
class Scheduled:
    """An accepted send."""

    id: str
    state: str
    deliver_at: int
    expires_at: int | None
    #: True when a repeated message_id matched an earlier message (nothing new was stored).
    duplicate: bool = False
    copies: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scheduled:
        return cls(
            id=data["id"],
            state=data["state"],
            deliver_at=data["deliver_at"],
            expires_at=data.get("expires_at"),
            duplicate=bool(data.get("duplicate", False)),
            copies=tuple((c["id"], c["queue"]) for c in data.get("copies", [])),
        )


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """A message's metadata and state (``GET /v1/messages/{id}``)."""

    id: str
    destination: str
    state: str
    deliver_at: int
    expires_at: int | None
    sent_at: int
    message_id: str | None
    correlation_id: str | None
    headers: dict[str, str]
    deaths: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MessageInfo:
        return cls(
            id=data["id"],
            destination=data["destination"],
            state=data["state"],
            deliver_at=data["deliver_at"],
            expires_at=data.get("expires_at"),
            sent_at=data.get("sent_at", 0),
            message_id=data.get("message_id"),
            correlation_id=data.get("correlation_id"),
            headers=data.get("headers") or {},
            deaths=data.get("deaths") or [],
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Received:
    """A message handed to this consumer; ack or nack it with ``receipt``."""

    id: str
    receipt: str
    body: bytes
    headers: dict[str, str]
    deliver_at: int
    expires_at: int | None
    redelivered: bool
    deaths: list[dict[str, Any]]
    message_id: str | None = None
    correlation_id: str | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Received:
        if data.get("body_base64") is not None:
            body = base64.b64decode(data["body_base64"])
        else:
            body = (data.get("body") or "").encode("utf-8")
        return cls(
            id=data["id"],
            receipt=data["receipt"],
            body=body,
            headers=data.get("headers") or {},
            deliver_at=data["deliver_at"],
            expires_at=data.get("expires_at"),
            redelivered=bool(data.get("redelivered")),
            deaths=data.get("deaths") or [],
            message_id=data.get("message_id"),
            correlation_id=data.get("correlation_id"),
        )


class ReceivedBatch(list[Received]):
    """What a receive took, as a list, and what came of the receipts it was given to ack:
    ``acked`` (None when it was given none) and ``unknown`` (receipts that matched no message
    in flight)."""

    def __init__(
        self, taken: Iterable[Received], *, acked: int | None = None, unknown: Iterable[str] = ()
    ) -> None:
        super().__init__(taken)
        self.acked = acked
        self.unknown = list(unknown)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    ready: int
    in_flight: int
    scheduled: int
    arguments: dict[str, Any]
    effective: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueInfo:
        return cls(
            name=data["name"],
            ready=data["ready"],
            in_flight=data["in_flight"],
            scheduled=data["scheduled"],
            arguments=data.get("arguments") or {},
            effective=data.get("effective") or {},
        )


@dataclass(frozen=True, slots=True)
class Page:
    """One page of ``list``; pass ``next_cursor`` back for the next one."""

    items: list[MessageInfo]
    next_cursor: str | None
