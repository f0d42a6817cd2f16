"""What the console's overview reads besides the per-message API: the due forecast, the last
minutes' rates and release lateness, and the dead letters by reason and original
destination."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.model.time import SystemClock
from tarry.server import schemas
from tarry.server.deps import caller, engine_of
from tarry.server.recent import RecentActivity
from tarry.server.responses import JSON

router = APIRouter(tags=["operations"])
_clock = SystemClock()


@router.get(
    "/v1/stats/forecast",
    summary="Scheduled messages by due window: next hour per minute, next day per hour, "
    "next 30 days per day",
    responses=schemas.answers({200: schemas.Forecast}, 401, 403, 503),
)
async def forecast(request: Request) -> JSON:
    caller(request).require_reads_all("the due forecast")
    return JSON(await engine_of(request).forecast())


@router.get(
    "/v1/stats/recent",
    summary="The last minutes: messages in and out and release lateness, every few seconds",
    responses=schemas.answers({200: schemas.Recent}, 401, 403),
)
async def recent(request: Request) -> JSON:
    caller(request).require_reads_all("the server's recent activity")
    activity: RecentActivity = request.app.state.recent
    return JSON(activity.report(_clock.now_ms()))


@router.get(
    "/v1/dead-letters",
    summary="Each dead-letter queue this token may read, its messages by reason and original "
    "destination",
    responses=schemas.answers({200: schemas.DeadLetters}, 401, 503),
)
async def dead_letters(request: Request) -> JSON:
    principal = caller(request)
    queues = await engine_of(request).dead_letters()
    return JSON({"items": [q for q in queues if principal.may_read(q["queue"])]})
