"""Policies: queue arguments by name pattern, user and operator, lowest TTL wins."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.server import schemas
from tarry.server.deps import caller, engine_of, json_object
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/policies", tags=["policies"])


@router.put(
    "/{name}",
    summary="Create or replace a policy",
    openapi_extra=schemas.body(schemas.PolicyBody),
    responses=schemas.answers({200: schemas.PolicyInfo}, 400, 401, 403, 503),
)
async def put_policy(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "set policy", name)
    policy = await engine_of(request).put_policy(name, await json_object(request))
    return JSON(policy.to_dict())


@router.get(
    "",
    summary="All policies",
    responses=schemas.answers({200: schemas.PolicyList}, 401, 403, 503),
)
async def list_policies(request: Request) -> JSON:
    caller(request)
    return JSON({"items": [p.to_dict() for p in await engine_of(request).list_policies()]})


@router.delete(
    "/{name}",
    summary="Delete a policy",
    responses=schemas.answers({200: schemas.Deleted}, 400, 401, 403, 404, 503),
)
async def delete_policy(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "delete policy", name)
    await engine_of(request).delete_policy(name)
    return JSON({"name": name, "deleted": True})
