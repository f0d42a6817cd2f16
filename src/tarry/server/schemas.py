"""Request and response shapes of api.md, for the OpenAPI document. The routes pass bodies to
the engine as they are, so the rules stay in ``tarry.model`` and are not written twice here:
a send's schema is built from the field table (``tarry.server.send_schema``), and the bounds the
other request models state are the ones the engine enforces.

Every model a route names is published in ``components/schemas`` (``tarry.server.openapi``),
so the ``$ref``s of the document resolve."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tarry.config import RouteConfig
from tarry.engine.consuming import MAX_VISIBILITY_MS
from tarry.errors import error_class_for, registered_codes
from tarry.model.fields import NAME_MAX_CHARS, NAME_PATTERN
from tarry.model.message import MAX_DELAY_MS, MAX_INT64
from tarry.model.queue_args import MAX_TTL_MS
from tarry.model.state import MessageState

__all__ = [
    "REQUEST_MODELS",
    "answers",
    "batch_schema",
    "body",
    "error_statuses",
]


def _name() -> Any:
    """An optional queue name, as ``check_name`` accepts it."""
    return Field(None, min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN)


# --- errors -------------------------------------------------------------------------------------
def _codes() -> tuple[str, ...]:
    # delivery_failed is a transport's, never sent to a client.
    return tuple(sorted(c for c in registered_codes() if c != "delivery_failed"))


class ErrorDetail(BaseModel):
    """What went wrong: a stable code and a sentence saying what to fix (plus details a client
    can act on, such as ``max_batch``)."""

    model_config = ConfigDict(extra="allow")
    code: str = Field(json_schema_extra={"enum": list(_codes())})
    message: str


class Error(BaseModel):
    """Every error response: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


# --- requests -----------------------------------------------------------------------------------
class Reschedule(BaseModel):
    """Exactly one of ``delay_ms`` (from now) or ``deliver_at``."""

    model_config = ConfigDict(extra="forbid")
    delay_ms: int | None = Field(None, ge=0, le=MAX_DELAY_MS)
    deliver_at: int | str | None = Field(None, description="epoch ms or RFC 3339")


class QueueArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message_ttl_ms: int | None = Field(None, ge=0, le=MAX_TTL_MS)
    expires_ms: int | None = Field(None, gt=0, le=MAX_TTL_MS)
    dead_letter_to: str | None = _name()
    max_length: int | None = Field(None, ge=0, le=MAX_INT64)
    overflow: Literal["drop_head", "reject_publish"] | None = None
    max_message_bytes: int | None = Field(None, gt=0, le=MAX_INT64)
    put_enabled: bool | None = None


class Receive(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max: int | None = Field(1, ge=1, le=1000)
    wait_ms: int | None = Field(0, ge=0, le=20000)
    visibility_ms: int | None = Field(None, ge=1, le=MAX_VISIBILITY_MS)
    ack: list[str] | None = Field(
        None,
        description="receipts of messages taken before, acked first in the same transaction "
        "(before any wait): a consumer's ack and its next receive in one request",
    )


class Ack(BaseModel):
    receipts: list[str]


class Nack(Ack):
    requeue: bool = True


class Redrive(BaseModel):
    """Which dead letters go back: all of the queue's (paged by ``max`` and ``cursor``), those
    the filters let through (the latest death's destination, reason and time), or ``ids``."""

    model_config = ConfigDict(extra="forbid")
    ids: list[str] | None = Field(None, min_length=1, max_length=1000)
    original_destination: str | None = _name()
    reason: Literal["expired", "rejected", "maxlen", "delivery_failed"] | None = None
    dead_after: int | str | None = Field(None, description="epoch ms or RFC 3339, inclusive")
    dead_before: int | str | None = Field(None, description="epoch ms or RFC 3339, exclusive")
    to: str | None = _name()  # a queue or route instead of each one's origin
    delay_ms: int | None = Field(None, ge=0, le=MAX_DELAY_MS)
    max: int | None = Field(None, ge=1, le=10_000, description="most moved (default 1000)")
    cursor: str | None = Field(None, description="the next_cursor of the previous answer")


class Redriven(BaseModel):
    moved: int
    skipped: int
    skipped_reasons: dict[str, int] = Field(
        description="why dead letters were left where they are, with how many"
    )
    next_cursor: str | None = Field(description="pass it back to go on; null when done")


class PolicyDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message_ttl_ms: int | None = Field(None, ge=0, le=MAX_TTL_MS)
    expires_ms: int | None = Field(None, gt=0, le=MAX_TTL_MS)
    dead_letter_to: str | None = _name()
    max_length: int | None = Field(None, ge=0, le=MAX_INT64)
    overflow: Literal["drop_head", "reject_publish"] | None = None


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pattern: str = Field(description="a regular expression over queue names")
    apply_to: Literal["queues"] = "queues"
    priority: int | None = Field(0, ge=-MAX_INT64, le=MAX_INT64)
    operator: bool = False
    definition: PolicyDefinition | None = None


# --- responses ----------------------------------------------------------------------------------
class Copy(BaseModel):
    id: str
    queue: str


class Scheduled(BaseModel):
    id: str
    state: MessageState | Literal["no_subscribers"] = Field(
        description="no_subscribers: a topic without subscribers, nothing was stored"
    )
    deliver_at: int
    expires_at: int | None
    duplicate: bool = Field(False, description="a repeated message_id: nothing was stored")
    copies: list[Copy] = Field([], description="a topic's copies, one per subscribed queue")


class Refused(BaseModel):
    error: ErrorDetail


class BatchResults(BaseModel):
    results: list[Scheduled | Refused] = Field(description="one per message, in order")


class Death(BaseModel):
    reason: Literal["expired", "rejected", "maxlen", "delivery_failed"]
    queue: str
    time: int
    count: int
    destination: str


class MessageInfo(BaseModel):
    id: str
    destination: str
    topic: str | None
    state: MessageState
    deliver_at: int
    expires_at: int | None
    sent_at: int
    message_id: str | None
    correlation_id: str | None
    reply_to: str | None
    report: list[Literal["expiration", "exception"]]
    on_undeliverable: Literal["dead_letter", "discard"]
    headers: dict[str, str]
    size: int | None = Field(description="the body's bytes; null once the message is finished")
    failures: int
    last_error: str | None
    deaths: list[Death]
    queue: str | None
    redelivered: bool


class BodyPreview(BaseModel):
    id: str
    size: int | None = Field(description="the whole body's bytes; null once it is finished")
    body_base64: str = Field(description="the first max_bytes bytes")
    truncated: bool


class MessagePage(BaseModel):
    items: list[MessageInfo]
    next_cursor: str | None


class Cancelled(BaseModel):
    id: str
    state: MessageState


class QueueArgumentsSet(BaseModel):
    message_ttl_ms: int | None
    expires_ms: int | None
    dead_letter_to: str | None
    max_length: int | None
    overflow: Literal["drop_head", "reject_publish"] | None
    max_message_bytes: int | None
    put_enabled: bool


class QueueArgumentsInForce(QueueArgumentsSet):
    overflow: Literal["drop_head", "reject_publish"]
    policy: str | None
    operator_policy: str | None


class QueueInfo(BaseModel):
    name: str
    ready: int
    in_flight: int
    scheduled: int
    consumers_waiting: int
    arguments: QueueArgumentsSet
    effective: QueueArgumentsInForce
    created_at: int
    last_used: int


class QueueList(BaseModel):
    items: list[QueueInfo]


class Deleted(BaseModel):
    name: str
    deleted: bool


class Delivered(BaseModel):
    id: str
    receipt: str
    body: str | None = Field(description="UTF-8 text; null when the body is not (see body_base64)")
    body_base64: str | None = None
    headers: dict[str, str]
    deliver_at: int
    expires_at: int | None
    sent_at: int
    message_id: str | None
    correlation_id: str | None
    redelivered: bool
    delivery_count: int
    deaths: list[Death]


class Received(BaseModel):
    messages: list[Delivered]
    acked: int | None = Field(None, description="with ack: the messages it acked")
    unknown: list[str] | None = Field(
        None, description="with ack: receipts that matched no message in flight"
    )


class Acked(BaseModel):
    acked: int
    unknown: list[str] = Field(description="receipts that matched no message in flight")


class Nacked(BaseModel):
    nacked: int
    unknown: list[str] = Field(description="receipts that matched no message in flight")


class TopicInfo(BaseModel):
    name: str
    subscriptions: list[str]
    created_at: int | None


class PolicyInfo(BaseModel):
    name: str
    pattern: str
    apply_to: Literal["queues"]
    priority: int
    operator: bool
    definition: PolicyDefinition


class PolicyList(BaseModel):
    items: list[PolicyInfo]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    open: list[str] = Field(
        description="the open circuit breakers, ingress when not consuming, overload while "
        "sends are refused"
    )
    breakers: dict[str, str]
    reasons: dict[str, str] = Field(
        default_factory=dict, description="why each open breaker opened (e.g. disk full)"
    )
    damaged: list[str] = Field(description="files a store found damaged")
    release_lag_ms: int = Field(
        0,
        description="how far behind due time releases are; above [dispatch] overload_lag_ms "
        "sends are refused with 429 overloaded and open lists overload",
    )
    delivery_lag_ms: int = Field(0, description="the worst queue's delivery lag (README)")
    queues_behind: int = Field(0, description="queues refusing sends: consumers behind")
    queue_rows_in_memory: dict[str, int] = Field({}, description="queue rows in memory, by kind")


class RouteInfo(BaseModel):
    """A route as ``tarry.toml`` declares it or ``PUT /v1/routes/{name}`` put it; credentials in
    its URL and header values are shown as ``***``, each secret as a fingerprint. Transport
    settings and the delivery policy (``mode``, ``rate_per_s``, ...) come too."""

    model_config = ConfigDict(extra="allow")

    name: str
    transport: Literal["http", "rabbitmq"]
    url: str
    timeout_ms: int
    headers: dict[str, str]
    secrets: list[str] = Field(
        description="a fingerprint per secret (whsec_…redacted (sha256 1a2b3c4d)), never a secret"
    )
    source: Literal["config", "api"] = Field(
        description="config: declared in tarry.toml (which wins a name clash); api: put at run time"
    )
    rate_per_s: float | None = Field(None, description="most deliveries started per second")
    concurrency: int | None = Field(None, description="most deliveries under way at once")
    retries: int | None = Field(None, description="attempts after the first (None: [dispatch])")
    retry_backoff_ms: int | None = Field(None, description="first retry delay, doubling")
    retry_backoff_max_ms: int | None = Field(None, description="longest retry delay")
    retry_jitter: float | None = Field(None, description="each retry delay spread by ± this")
    on_failure_report_to: str | None = Field(
        None,
        description="queue, topic or route told when a message is dead-lettered (*** when "
        "this token may not inspect it)",
    )
    dead_letter_to: str | None = Field(
        None,
        description="queue a dead-lettered message goes to instead of the error queue (*** when "
        "this token may not inspect it)",
    )


class RouteDeleted(BaseModel):
    name: str
    deleted: bool
    dead_lettered: int = Field(description="waiting messages dead-lettered (force=true)")


class RouteList(BaseModel):
    items: list[RouteInfo]


class SnapshotSeconds(BaseModel):
    bounds: list[float] = Field(description="upper bounds of the buckets, in seconds")
    counts: list[int] = Field(description="snapshots per bucket, the last one past every bound")
    sum: float


class StoreWritePath(BaseModel):
    fsyncs: dict[str, int] = Field(description="fsyncs by what they made durable")
    group_commits: int
    durable_group_commits: int = Field(
        0, description="group commits with a durable write (a producer's), one fsync each"
    )
    wal_bytes: int = Field(0, description="bytes appended to the write-ahead log")
    snapshot_seconds: SnapshotSeconds
    checkpoint_seconds: SnapshotSeconds | None = Field(
        None, description="checkpoint durations (a checkpoint writes the snapshot)"
    )


class Stats(BaseModel):
    messages: dict[str, int]
    queues: int
    topics: int
    policies: int
    routes: list[str]
    consumers_waiting: int
    delivery_lag_ms: dict[str, int] = Field(default_factory=dict, description="per queue")
    dispatch: dict[str, int]
    store_commits: int
    journal_dropped: int
    store_write_path: StoreWritePath | None = Field(
        None, description="the log store's write path (null for the other stores)"
    )
    health: Health


class ScheduleBody(BaseModel):
    """A recurring schedule (``tarry.model.schedule``); each occurrence is an ordinary message
    with ``message_id`` ``sched:{name}:{epoch ms}``."""

    model_config = ConfigDict(extra="forbid")
    cron: str = Field(description="5 fields, or 6 with seconds first; @daily and friends")
    timezone: str | None = Field("UTC", description="an IANA zone, e.g. Europe/Paris")
    destination: str = Field(min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN)
    body: str | None = None
    body_base64: str | None = None
    headers: dict[str, str] | None = None
    ttl_ms: int | None = Field(
        None, ge=0, le=MAX_INT64, description="each occurrence expires this long after its time"
    )
    start_at: int | str | None = Field(None, description="epoch ms or RFC 3339")
    end_at: int | str | None = Field(None, description="epoch ms or RFC 3339")
    catch_up: Literal["skip", "once"] | None = "skip"


class Occurrence(BaseModel):
    at: int
    local: str = Field(description="the time in the schedule's zone, with its offset")
    message_id: str


class ScheduleInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    cron: str
    timezone: str
    destination: str
    headers: dict[str, str]
    ttl_ms: int | None
    start_at: int | None
    end_at: int | None
    catch_up: Literal["skip", "once"]
    created_at: int
    revision: int = Field(description="when this definition was put")
    planned_through: int = Field(description="occurrences up to this time are stored")
    finished: bool
    last_error: str | None = Field(description="why the last top-up stored nothing, if it failed")
    next: list[Occurrence]


class ScheduleList(BaseModel):
    items: list[ScheduleInfo]


class ScheduleDeleted(Deleted):
    cancelled: int = Field(description="stored occurrences cancelled")


class ForecastSeries(BaseModel):
    start: int = Field(description="the first window's start (the minute it was counted in)")
    width_ms: int
    counts: list[int] = Field(description="scheduled messages due in each window, in order")
    computed_at: int = Field(description="when it was counted")


class Forecast(BaseModel):
    """From the store's due index (the log store shares a time partition's count among the
    windows it overlaps, unless its index is loaded). Each series is counted again in the
    background once it is 5 s (next hour), 1 min (next day) or 5 min (next 30 days) old; null
    while its first count is not done."""

    computed_at: int
    scheduled: int | None = Field(
        description="every scheduled message (counted at most once a minute; null at first)"
    )
    next_hour: ForecastSeries | None = Field(description="per minute")
    next_day: ForecastSeries | None = Field(description="per hour")
    next_30_days: ForecastSeries | None = Field(description="per day")


class RecentWindow(BaseModel):
    start: int
    in_: int = Field(alias="in", description="messages scheduled")
    out: int = Field(description="messages released into a queue or delivered to a route")
    lateness_p50_ms: int | None
    lateness_p99_ms: int | None
    lateness_max_ms: int | None


class Recent(BaseModel):
    """The last minutes, window by window (percentiles from a sample of each window)."""

    now: int
    window_ms: int
    windows: list[RecentWindow]
    lateness_p50_ms: int | None
    lateness_p99_ms: int | None
    lateness_max_ms: int | None


class DeadLetterGroup(BaseModel):
    reason: str = Field(description="deaths[0].reason (empty: the message never died)")
    original_destination: str = Field(description="deaths[0].destination")
    count: int
    oldest: int = Field(description="the earliest deaths[0].time of the group")
    newest: int


class DeadLetterQueue(BaseModel):
    queue: str
    groups: list[DeadLetterGroup]


class DeadLetters(BaseModel):
    items: list[DeadLetterQueue]


class TopicList(BaseModel):
    items: list[TopicInfo]


#: The request bodies by component name: pydantic models, and the send built from the table.
REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    Reschedule,
    QueueArguments,
    Receive,
    Ack,
    Nack,
    PolicyBody,
    ScheduleBody,
    RouteConfig,
    Redrive,
)


def batch_schema() -> dict[str, Any]:
    """``{"messages": [send, ...]}``: each send is checked on its own (a refused one gets its
    error in the results, the others go on), so the body is refused only when it is not this
    shape."""
    return {
        "title": "SendBatch",
        "type": "object",
        "properties": {"messages": {"type": "array", "items": _ref("SendMessage"), "minItems": 1}},
        "required": ["messages"],
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def body(name: str | type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """An ``openapi_extra`` that documents the component ``name`` as the JSON request body."""
    if not isinstance(name, str):
        name = name.__name__
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": _ref(name)}},
        }
    }


#: What each error status means, in the document.
_STATUS_TEXT = {
    400: "the request is invalid (the message says what to fix)",
    401: "no or an unknown bearer token",
    403: "the token does not allow this",
    404: "no such thing",
    409: "the state does not allow it",
    413: "the message is too large",
    429: "the destination is full",
    503: "the store cannot accept now; nothing was stored",
}


def error_statuses() -> dict[int, list[str]]:
    """Each error status with the codes it carries (api.md's list, from the registry)."""
    out: dict[int, list[str]] = {}
    for code in _codes():
        out.setdefault(error_class_for(code).http_status, []).append(code)
    return out


def answers(
    ok: dict[int, type[BaseModel]], *errors: int, description: str = "done"
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: its answers and the error statuses it can send, each with
    the ``Error`` body and the codes it carries."""
    codes = error_statuses()
    out: dict[int | str, dict[str, Any]] = {
        status: {"model": model, "description": description} for status, model in ok.items()
    }
    for status in errors:
        out[status] = {
            "model": Error,
            "description": f"{_STATUS_TEXT[status]}: {', '.join(codes[status])}",
        }
    return out
