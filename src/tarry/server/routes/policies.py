"""Policies: queue arguments by name pattern, user and operator, lowest TTL wins."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.engine.api import EngineAPI
from tarry.model.queue_args import Policy, parse_policy
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
    engine, data = engine_of(request), await json_object(request)
    principal.require_policy(parse_policy(name, data), action="set")
    stored = await _stored(engine, name)
    if stored is not None:  # replacing it takes it away from the queues it reaches
        principal.require_policy(stored, action="replace")
    policy = await engine.put_policy(name, data)
    return JSON(principal.policy_view(policy.to_dict()))


async def _stored(engine: EngineAPI, name: str) -> Policy | None:
    return next((p for p in await engine.list_policies() if p.name == name), None)


@router.get(
    "",
    summary="All policies",
    responses=schemas.answers({200: schemas.PolicyList}, 401, 403, 503),
)
async def list_policies(request: Request) -> JSON:
    principal = caller(request)
    policies = await engine_of(request).list_policies()
    shown = [principal.policy_view(p.to_dict()) for p in policies if principal.may_read(p.name)]
    return JSON({"items": shown})


@router.delete(
    "/{name}",
    summary="Delete a policy",
    responses=schemas.answers({200: schemas.Deleted}, 400, 401, 403, 404, 503),
)
async def delete_policy(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "delete policy", name)
    engine = engine_of(request)
    stored = await _stored(engine, name)
    if stored is not None:
        principal.require_policy(stored, action="delete")
    await engine.delete_policy(name)
    return JSON({"name": name, "deleted": True})
