"""Topics and their subscriptions: a delayed publish fans out at send time."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.server import schemas
from tarry.server.deps import caller, engine_of
from tarry.server.responses import JSON

router = APIRouter(prefix="/v1/topics", tags=["topics"])


@router.put(
    "/{name}",
    summary="Declare a topic",
    responses=schemas.answers(
        {200: schemas.TopicInfo, 201: schemas.TopicInfo}, 400, 401, 403, 409, 503
    ),
)
async def declare(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "declare", name)
    info, created = await engine_of(request).declare_topic(name)
    return JSON(principal.topic_view(info), status_code=201 if created else 200)


@router.get(
    "",
    summary="All topics this token may inspect, with their subscribed queues",
    responses=schemas.answers({200: schemas.TopicList}, 401, 503),
)
async def list_topics(request: Request) -> JSON:
    principal = caller(request)
    topics = await engine_of(request).list_topics()
    shown = [principal.topic_view(t) for t in topics if principal.may_describe(t["name"])]
    return JSON({"items": shown})


@router.get(
    "/{name}",
    summary="A topic and its subscribed queues",
    responses=schemas.answers({200: schemas.TopicInfo}, 400, 401, 403, 404, 503),
)
async def show(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require_describe(name)
    return JSON(principal.topic_view(await engine_of(request).topic_info(name)))


@router.put(
    "/{name}/subscriptions/{queue}",
    summary="Subscribe a queue to the topic",
    responses=schemas.answers({200: schemas.TopicInfo}, 400, 401, 403, 404, 503),
)
async def subscribe(request: Request, name: str, queue: str) -> JSON:
    principal = caller(request)
    principal.require_subscription(name, queue, action="subscribe")
    return JSON(principal.topic_view(await engine_of(request).subscribe(name, queue)))


@router.delete(
    "/{name}/subscriptions/{queue}",
    summary="Unsubscribe a queue",
    responses=schemas.answers({200: schemas.TopicInfo}, 400, 401, 403, 404, 503),
)
async def unsubscribe(request: Request, name: str, queue: str) -> JSON:
    principal = caller(request)
    principal.require_subscription(name, queue, action="unsubscribe")
    await engine_of(request).unsubscribe(name, queue)
    return JSON(principal.topic_view(await engine_of(request).topic_info(name)))
