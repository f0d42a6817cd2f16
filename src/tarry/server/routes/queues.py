"""Local queues: declare, inspect, delete, receive, ack, nack."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tarry.engine.consuming import check_receipts
from tarry.errors import InvalidArgument
from tarry.model.queue_args import parse_queue_args
from tarry.server import schemas
from tarry.server.deps import caller, engine_of, json_object
from tarry.server.responses import JSON, Encoded, received

router = APIRouter(prefix="/v1/queues", tags=["queues"])


@router.put(
    "/{name}",
    summary="Declare a queue (idempotent for equal arguments)",
    openapi_extra=schemas.body(schemas.QueueArguments, required=False),
    responses=schemas.answers(
        {200: schemas.QueueInfo, 201: schemas.QueueInfo}, 400, 401, 403, 409, 503
    ),
)
async def declare(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "declare", name)
    args = await json_object(request, default={})
    principal.require_dead_letter_to(parse_queue_args(args))
    info, created = await engine_of(request).declare_queue(name, args)
    return JSON(principal.queue_view(info.to_public()), status_code=201 if created else 200)


@router.get(
    "",
    summary="All queues with their counts",
    responses=schemas.answers({200: schemas.QueueList}, 401, 403, 503),
)
async def list_queues(request: Request) -> JSON:
    principal = caller(request)
    queues = await engine_of(request).list_queues()
    shown = [principal.queue_view(q.to_public()) for q in queues if principal.may_describe(q.name)]
    return JSON({"items": shown})


@router.get(
    "/{name}",
    summary="A queue's counts and the arguments in force",
    responses=schemas.answers({200: schemas.QueueInfo}, 400, 401, 403, 404, 503),
)
async def show(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require_describe(name)
    return JSON(principal.queue_view((await engine_of(request).queue_info(name)).to_public()))


@router.delete(
    "/{name}",
    summary="Delete a queue and its messages (not dead-lettered)",
    responses=schemas.answers({200: schemas.Deleted}, 400, 401, 403, 404, 409, 503),
)
async def delete(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_admin(name), "delete", name)
    await engine_of(request).delete_queue(name)
    return JSON({"name": name, "deleted": True})


def _int(body: dict[str, object], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{key} must be a whole number, got {value!r}")
    return value


@router.post(
    "/{name}/receive",
    summary="Take up to max ready messages, waiting up to wait_ms for the first",
    openapi_extra=schemas.body(schemas.Receive, required=False),
    responses=schemas.answers({200: schemas.Received}, 400, 401, 403, 404, 503),
)
async def receive(request: Request, name: str) -> Encoded:
    principal = caller(request)
    principal.require(principal.may_receive(name), "receive from", name)
    body = await json_object(request, default={})
    unknown = set(body) - {"max", "wait_ms", "visibility_ms", "ack"}
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(sorted(unknown))}")
    deliveries = await engine_of(request).receive(
        name,
        max_messages=_int(body, "max", 1) or 0,
        wait_ms=_int(body, "wait_ms", 0) or 0,
        visibility_ms=_int(body, "visibility_ms", None),
        ack=None if body.get("ack") is None else check_receipts(body["ack"], "ack"),
    )
    return Encoded(received(deliveries))


@router.post(
    "/{name}/ack",
    summary="Acknowledge messages",
    openapi_extra=schemas.body(schemas.Ack),
    responses=schemas.answers({200: schemas.Acked}, 400, 401, 403, 404, 503),
)
async def ack(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_receive(name), "ack on", name)
    body = await json_object(request)
    return JSON(await engine_of(request).ack(name, check_receipts(body.get("receipts"))))


@router.post(
    "/{name}/nack",
    summary="Requeue (requeue=true) or dead-letter with reason rejected",
    openapi_extra=schemas.body(schemas.Nack),
    responses=schemas.answers({200: schemas.Nacked}, 400, 401, 403, 404, 503),
)
async def nack(request: Request, name: str) -> JSON:
    principal = caller(request)
    principal.require(principal.may_receive(name), "nack on", name)
    body = await json_object(request)
    requeue = body.get("requeue", True)
    if not isinstance(requeue, bool):
        raise InvalidArgument("requeue must be true or false")
    return JSON(
        await engine_of(request).nack(name, check_receipts(body.get("receipts")), requeue=requeue)
    )


#: The routes ``tarry.server.fast_lane.FastLane`` serves ahead of the app, by (method, action of
#: ``/v1/queues/{name}/<action>``): a consumer calls them for every batch it takes.
CONSUMER_ROUTES = {("POST", "receive"): receive, ("POST", "ack"): ack, ("POST", "nack"): nack}
