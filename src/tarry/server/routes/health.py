"""Health, statistics and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from tarry.server import schemas
from tarry.server.auth import visible_health
from tarry.server.deps import caller, engine_of
from tarry.server.responses import JSON

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    summary="ok, or degraded with the open circuit breakers (HTTP 200 in both cases)",
    responses=schemas.answers({200: schemas.Health}),
)
async def healthz(request: Request) -> JSON:
    health = engine_of(request).health()
    return JSON(visible_health(health, request, request.app.state.config.auth))


@router.get(
    "/v1/stats",
    summary="Counts by state, queues, dispatcher figures",
    responses=schemas.answers({200: schemas.Stats}, 401, 403, 503),
)
async def stats(request: Request) -> JSON:
    caller(request).require_reads_all("the server's statistics")
    return JSON(await engine_of(request).stats())


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "description": "the Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(request: Request) -> Response:
    body, content_type = await request.app.state.metrics.render(engine_of(request))
    return Response(body, media_type=content_type)
