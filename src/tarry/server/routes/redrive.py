"""Redrive: send a queue's dead letters back to where they came from."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.server import schemas
from tarry.server.deps import caller, engine_of, json_object
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/queues", tags=["queues"])


@router.post(
    "/{name}/redrive",
    summary="Move dead letters of this queue back to their original destinations, each once",
    openapi_extra=schemas.body(schemas.Redrive, required=False),
    responses=schemas.answers({200: schemas.Redriven}, 400, 401, 403, 404, 503),
)
async def redrive(request: Request, name: str) -> JSON:
    # Taking dead letters out of their queue is receiving from it; each destination they go
    # to is checked per message (the token must be able to send there, else it stays).
    principal = caller(request)
    principal.require(principal.may_receive(name), "redrive from", name, scope="receive")
    body = await json_object(request, default={})
    answer = await engine_of(request).redrive(name, body, may_send=principal.may_send)
    return JSON(answer)
