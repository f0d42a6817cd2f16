"""Recurring schedules: a cron expression in a time zone, whose occurrences become ordinary
scheduled messages (``tarry.engine.schedules``).

Authorisation (``tarry.server.auth``): the schedule's name is a name in the token's scopes
(``admin`` to put or delete it, ``read`` to see it), and so is its destination: ``send`` when it
is put (checked by the send rules) and again before a replace or a delete cancels the
occurrences stored there, ``read`` to see it (its body is that destination's future
messages)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.errors import NotFound
from tarry.server import schemas
from tarry.server.auth import Principal
from tarry.server.deps import caller, engine_of, json_object
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


async def _may_cancel_stored(
    request: Request, principal: Principal, name: str, *, action: str
) -> None:
    """Replacing or deleting a schedule cancels what it stored: send on its destination."""
    try:
        stored = await engine_of(request).get_schedule(name)
    except NotFound:
        return
    principal.require_schedule(stored, action=action, scope="send")


@router.put(
    "/{name}",
    summary="Create or replace a recurring schedule; answers with its next occurrences",
    openapi_extra=schemas.body(schemas.ScheduleBody),
    responses=schemas.answers(
        {200: schemas.ScheduleInfo, 201: schemas.ScheduleInfo},
        400,
        401,
        403,
        404,
        409,
        413,
        429,
        503,
    ),
)
async def put_schedule(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "set schedule", name, scope="admin")
    data = await json_object(request, kind="message")
    await _may_cancel_stored(request, principal, name, action="replace")
    info, created = await engine_of(request).put_schedule(name, data, may_send=principal.may_send)
    return JSON(info, status_code=201 if created else 200)


@router.get(
    "",
    summary="The schedules this token may read",
    responses=schemas.answers({200: schemas.ScheduleList}, 401, 503),
)
async def list_schedules(request: Request) -> JSON:
    principal = caller(request)
    items = await engine_of(request).list_schedules()
    return JSON({"items": [s for s in items if principal.may_see_schedule(s)]})


@router.get(
    "/{name}",
    summary="A schedule, its next occurrences and how far they are stored",
    responses=schemas.answers({200: schemas.ScheduleInfo}, 400, 401, 403, 404, 503),
)
async def get_schedule(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require_read(name)
    schedule = await engine_of(request).get_schedule(name)
    principal.require_schedule(schedule, action="read", scope="read")
    return JSON(schedule)


@router.delete(
    "/{name}",
    summary="Delete a schedule and cancel the occurrences it stored",
    responses=schemas.answers({200: schemas.ScheduleDeleted}, 400, 401, 403, 404, 503),
)
async def delete_schedule(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "delete schedule", name, scope="admin")
    await _may_cancel_stored(request, principal, name, action="delete")
    return JSON(await engine_of(request).delete_schedule(name))
