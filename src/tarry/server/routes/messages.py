"""Messages: schedule (one or a batch), inspect, list, cancel, reschedule."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Query, Request

from tarry.engine.types import ColumnResults, SendResult
from tarry.errors import InvalidArgument, NotAuthorized, NotFound, TarryError
from tarry.model.query import MessageQuery
from tarry.model.time import parse_instant_ms
from tarry.server import schemas
from tarry.server.auth import Principal
from tarry.server.deps import batch_messages, caller, engine_of, json_object
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/messages", tags=["messages"])


@router.post(
    "",
    status_code=201,
    summary="Schedule one message",
    openapi_extra=schemas.body("SendMessage"),
    responses={
        **schemas.answers({201: schemas.Scheduled}, 400, 401, 403, 404, 409, 413, 429, 503),
        200: {"model": schemas.Scheduled, "description": "a repeated message_id: nothing stored"},
    },
)
async def send(request: Request) -> JSON:
    principal = caller(request)  # before the body is read: a stranger's body is not
    data = await json_object(request, kind="message")
    result = await engine_of(request).send(data, may_send=principal.may_send)
    return JSON(principal.sent_view(result.to_public()), status_code=201 if result.created else 200)


@router.post(
    "/batch",
    summary="Schedule many messages; each accepted or rejected on its own",
    openapi_extra=schemas.body("SendBatch"),
    responses=schemas.answers({200: schemas.BatchResults}, 400, 401, 403, 413, 429, 503),
)
async def send_batch(request: Request) -> JSON:
    principal = caller(request)
    messages = await batch_messages(request, max_batch=request.app.state.config.server.max_batch)
    results = await engine_of(request).send_batch(messages, may_send=principal.may_send)
    if isinstance(results, ColumnResults):  # plain sends: no copies to show
        return JSON({"results": results.public(_refusal)})
    return JSON({"results": [_result(r, principal) for r in results]})


#: The routes ``tarry.server.fast_lane.FastLane`` serves ahead of the app, by (method, path): a
#: producer calls one of them for every message or batch it sends.
PRODUCER_ROUTES = {("POST", "/v1/messages"): send, ("POST", "/v1/messages/batch"): send_batch}


def _refusal(error: TarryError) -> dict[str, Any]:
    return {"error": error.to_dict()}


def _result(result: SendResult | TarryError, principal: Principal) -> dict[str, Any]:
    if isinstance(result, TarryError):
        return _refusal(result)
    public = result.to_public()
    return principal.sent_view(public) if result.copies else public  # it shows copies only


def _instant(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    return parse_instant_ms(value, field=name)


def _instant_query() -> Any:
    """A time filter: epoch ms or RFC 3339 (documented here; ``_instant`` reads it)."""
    return Query(
        None,
        description="epoch ms or an RFC 3339 time",
        json_schema_extra={
            "anyOf": [
                {"type": "string", "pattern": "^[0-9]{1,15}$"},
                {"type": "string", "format": "date-time"},
            ]
        },
    )


@router.get(
    "",
    summary="List messages ordered by deliver_at",
    responses=schemas.answers({200: schemas.MessagePage}, 400, 401, 403, 503),
)
async def list_messages(
    request: Request,
    destination: str | None = None,
    correlation_id: str | None = None,
    message_id: str | None = None,
    state: str | None = None,
    due_after: str | None = _instant_query(),
    due_before: str | None = _instant_query(),
    limit: int = Query(100, json_schema_extra={"minimum": 1, "maximum": 1000}),
    cursor: str | None = Query(None, description="next_cursor of the page before"),
) -> JSON:
    principal = caller(request)
    # A scoped token lists one destination it may read: filtering a listing of everything
    # would page through every tenant's messages to fill one page of its own.
    if not principal.reads_all:
        if destination is None:
            raise NotAuthorized(
                "this token may not list every destination's messages: add ?destination=NAME "
                "(tarry ls --destination NAME) naming one it may read"
            )
        principal.require_read(destination)
    query = MessageQuery(
        destination=destination,
        correlation_id=correlation_id,
        message_id=message_id,
        state=state,
        due_after_ms=_instant(due_after, "due_after"),
        due_before_ms=_instant(due_before, "due_before"),
        limit=limit,
        cursor=cursor,
    )
    items, next_cursor = await engine_of(request).list_messages(query)
    return JSON({"items": [m.to_public() for m in items], "next_cursor": next_cursor})


@router.get(
    "/{message_id}",
    summary="A message's metadata and state",
    responses=schemas.answers({200: schemas.MessageInfo}, 400, 401, 403, 404, 503),
)
async def get_message(request: Request, message_id: str) -> JSON:
    principal = caller(request)
    message = await engine_of(request).get_message(message_id)
    if not principal.may_read_message(message):
        # As if it did not exist: a 403 would tell that this id is in use.
        raise NotFound(f"no message with id {message_id}")
    return JSON(message.to_public())


@router.get(
    "/{message_id}/body",
    summary="The first bytes of a message's body (base64), to preview it",
    responses=schemas.answers({200: schemas.BodyPreview}, 400, 401, 403, 404, 503),
)
async def get_body(
    request: Request,
    message_id: str,
    max_bytes: int = Query(
        65_536, description="bytes to return at most", json_schema_extra={"minimum": 1}
    ),
) -> JSON:
    if max_bytes < 1:
        raise InvalidArgument(f"max_bytes ({max_bytes}) must be at least 1")
    principal = caller(request)
    message = await engine_of(request).get_message(message_id)
    if not principal.may_read_message(message):
        raise NotFound(f"no message with id {message_id}")
    public = message.to_public()
    head = message.body[:max_bytes] if public["size"] is not None else b""
    return JSON(
        {
            "id": message.id,
            "size": public["size"],
            "body_base64": base64.b64encode(head).decode("ascii"),
            "truncated": len(head) < (public["size"] or 0),
        }
    )


@router.delete(
    "/{message_id}",
    summary="Cancel a scheduled message",
    responses=schemas.answers({200: schemas.Cancelled}, 400, 401, 403, 404, 409, 503),
)
async def cancel(request: Request, message_id: str) -> JSON:
    principal, engine = caller(request), engine_of(request)
    principal.require_message_owner(await engine.get_message(message_id))
    message = await engine.cancel(message_id, may_send=principal.may_send)
    return JSON({"id": message.id, "state": message.state.value})


@router.post(
    "/{message_id}/reschedule",
    summary="Move a scheduled message to another time",
    openapi_extra=schemas.body(schemas.Reschedule),
    responses=schemas.answers({200: schemas.MessageInfo}, 400, 401, 403, 404, 409, 503),
)
async def reschedule(request: Request, message_id: str) -> JSON:
    principal, engine = caller(request), engine_of(request)
    principal.require_message_owner(await engine.get_message(message_id))
    data = await json_object(request)
    message = await engine.reschedule(message_id, data, may_send=principal.may_send)
    return JSON(message.to_public())
