"""Routes: the destinations outside tarry (HTTP endpoints, RabbitMQ) a message can be sent to,
as configured, without their secrets."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tarry.config import RouteConfig
from tarry.errors import NotFound
from tarry.server import schemas
from tarry.server.deps import caller
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/routes", tags=["routes"])


def _public(name: str, route: RouteConfig) -> dict[str, Any]:
    return {"name": name, **route.redacted()}


@router.get(
    "",
    summary="The routes this token may send to or read",
    responses=schemas.answers({200: schemas.RouteList}, 401, 503),
)
async def list_routes(request: Request) -> JSON:
    principal = caller(request)
    routes: dict[str, RouteConfig] = request.app.state.config.routes
    return JSON(
        {
            "items": [
                _public(name, route)
                for name, route in sorted(routes.items())
                if principal.may_describe(name)
            ]
        }
    )


@router.get(
    "/{name}",
    summary="A route's settings (credentials and header values hidden)",
    responses=schemas.answers({200: schemas.RouteInfo}, 400, 401, 403, 404, 503),
)
async def get_route(request: Request, name: str) -> JSON:
    caller(request).require_describe(name)
    route: RouteConfig | None = request.app.state.config.routes.get(name)
    if route is None:
        raise NotFound(f"no route named {name!r}; GET /v1/routes lists them")
    return JSON(_public(name, route))
