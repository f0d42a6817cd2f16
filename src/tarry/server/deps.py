"""What every route needs: the engine, the caller, and a JSON body read with orjson, no larger
than the route allows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from fastapi import Request

from tarry.config import ServerConfig
from tarry.engine.api import EngineAPI
from tarry.errors import InvalidArgument, MessageTooLarge
from tarry.model.validate import check_batch_size
from tarry.server.auth import Principal, principal_for
from tarry.server.refusals import RefusalLog

__all__ = ["BodyLimits", "batch_messages", "caller", "engine_of", "json_body", "json_object"]

BodyKind = Literal["small", "message", "batch"]

# Room for a message's fields besides its body (destination, headers, ids, times).
ENVELOPE_BYTES = 64 * 1024
# A body byte can become six in JSON (a control character as \u00XX), so a body within
# max_message_bytes is never refused by the request limit before its own check says why.
JSON_EXPANSION = 6
SMALL_BODY_BYTES = 1024 * 1024
BATCH_BODY_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """Largest request body per kind of route, in bytes."""

    small: int
    message: int
    batch: int

    @classmethod
    def from_config(cls, server: ServerConfig) -> BodyLimits:
        message = JSON_EXPANSION * server.max_message_bytes + ENVELOPE_BYTES
        batch = server.max_batch_bytes or max(BATCH_BODY_BYTES, message)
        return cls(small=SMALL_BODY_BYTES, message=message, batch=batch)


def engine_of(request: Request) -> EngineAPI:
    engine: EngineAPI = request.app.state.engine
    return engine


def caller(request: Request) -> Principal:
    return principal_for(request, request.app.state.config.auth)


def _too_large(request: Request, limit: int, kind: BodyKind) -> MessageTooLarge:
    # The rest of the body stays unread: the error handler closes the connection after the 413.
    request.state.body_unread = True
    refusals: RefusalLog = request.app.state.refusals
    refusals.note("body_too_large", f"refused a request body over {limit} bytes with 413")
    hint = "send fewer messages per batch" if kind == "batch" else "send a smaller body"
    return MessageTooLarge(
        f"the request body is over this server's limit of {limit} bytes for "
        f"{request.method} {request.url.path}; {hint}",
        max_request_bytes=limit,
    )


async def _read(request: Request, kind: BodyKind) -> bytearray:
    """The body, refused as soon as its declared or streamed size passes the route's limit.
    Gathered in one growing buffer: a list of chunks joined at the end would hold the body
    twice at its peak."""
    limits: BodyLimits = request.app.state.body_limits
    limit: int = getattr(limits, kind)
    declared = request.headers.get("content-length")
    # (A length of more digits than any limit is not converted: int() refuses 4,300 digits.)
    if declared and declared.isdecimal() and (len(declared) > 18 or int(declared) > limit):
        raise _too_large(request, limit, kind)
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise _too_large(request, limit, kind)
        body += chunk
    return body


def _parse(raw: bytearray, default: Any) -> Any:
    if not raw.strip():
        if default is not None:
            return default
        raise InvalidArgument("the request needs a JSON body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc}") from None


async def json_body(request: Request, *, default: Any = None, kind: BodyKind = "small") -> Any:
    return _parse(await _read(request, kind), default)


def _keep_batch(pairs: list[tuple[str, Any]]) -> dict[str, Any] | None:
    return dict(pairs) if any(key == "messages" for key, _ in pairs) else None


def _counted_messages(raw: bytearray) -> int | None:
    """How many items the body's ``messages`` list holds, counted without keeping them: each
    object is dropped as soon as it is parsed (the whole body would take ~10x its size)."""
    try:
        body = json.loads(raw, object_pairs_hook=_keep_batch)
    except (ValueError, RecursionError):
        return None  # the real parse says what is wrong
    messages = body.get("messages") if isinstance(body, dict) else None
    return len(messages) if isinstance(messages, list) else None


async def batch_messages(request: Request, *, max_batch: int) -> list[Any]:
    """The items of a ``{"messages": [...]}`` body; more than ``max_batch`` of them are refused
    before any is built."""
    raw = await _read(request, "batch")
    # Every item but the last is followed by a comma: fewer commas, no need to count.
    if raw.count(b",") >= max_batch:
        counted = _counted_messages(raw)
        if counted is not None:
            check_batch_size(range(counted), limit=max_batch)
    body = _parse(raw, None)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise InvalidArgument('the body must be {"messages": [...]}')
    messages: list[Any] = body["messages"]
    return messages


async def json_object(
    request: Request, *, default: dict[str, Any] | None = None, kind: BodyKind = "small"
) -> dict[str, Any]:
    body = await json_body(request, default=default, kind=kind)
    if not isinstance(body, dict):
        raise InvalidArgument("the body must be a JSON object")
    return body
