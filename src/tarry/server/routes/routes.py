"""Routes: the destinations outside tarry (HTTP endpoints, RabbitMQ), declared in ``tarry.toml``
or put at run time, shown without their secrets, credentials or header values."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from tarry.config import RouteConfig
from tarry.server import schemas
from tarry.server.deps import caller, engine_of, json_object
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/routes", tags=["routes"])


@router.put(
    "/{name}",
    summary="Create or replace a route (in force at once, kept across restarts)",
    openapi_extra=schemas.body(RouteConfig),
    responses=schemas.answers(
        {200: schemas.RouteInfo, 201: schemas.RouteInfo}, 400, 401, 403, 409, 503
    ),
)
async def put_route(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "put route", name, scope="admin")
    data = await json_object(request)
    principal.require_route_policy(RouteConfig.parse(name, data).policy)
    entry, created = await engine_of(request).put_route(name, data)
    return JSON(principal.route_view(entry.to_public()), status_code=201 if created else 200)


@router.get(
    "",
    summary="The routes this token may send to or read",
    responses=schemas.answers({200: schemas.RouteList}, 401, 503),
)
async def list_routes(request: Request) -> JSON:
    principal = caller(request)
    entries = engine_of(request).list_routes()
    shown = [principal.route_view(e.to_public()) for e in entries if principal.may_describe(e.name)]
    return JSON({"items": shown})


@router.get(
    "/{name}",
    summary="A route's settings (secrets, credentials and header values hidden)",
    responses=schemas.answers({200: schemas.RouteInfo}, 400, 401, 403, 404, 503),
)
async def get_route(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require_describe(name)
    return JSON(principal.route_view(engine_of(request).get_route(name).to_public()))


@router.delete(
    "/{name}",
    summary="Delete a route put at run time (409 in_use while messages wait, unless force)",
    responses=schemas.answers({200: schemas.RouteDeleted}, 400, 401, 403, 404, 409, 503),
)
async def delete_route(
    request: Request,
    name: str,
    force: bool = Query(
        False, description="dead-letter the messages waiting for the route instead of 409"
    ),
) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "delete route", name, scope="admin")
    dead = await engine_of(request).delete_route(name, force=force)
    return JSON({"name": name, "deleted": True, "dead_lettered": dead})
